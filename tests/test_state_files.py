"""A cluster's state files on this machine (`gpuyard up`'s state directory), damaged: one line
naming the file and how to mend it, never a traceback, and never the default server instead of
the cluster's; the server's users (made from the keys) mend themselves."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuyard.cli.options import CommandError, add_nats_options, resolve_options
from gpuyard.natsauth import OPERATOR, Credentials, local_profile

DAMAGE = b"\x95\x00{not json"


def test_damaged_credentials_name_the_file(tmp_path: Path) -> None:
    creds = Credentials(tmp_path, "c1")
    creds.init()
    (tmp_path / "auth" / "identities.json").write_bytes(DAMAGE)
    with pytest.raises(ValueError, match=r"auth/identities\.json: damaged \(.*\): restore it"):
        creds.init()

    creds = Credentials(tmp_path / "again", "c1")
    creds.init()
    profile = creds.profile_path(OPERATOR)
    profile.write_bytes(DAMAGE)
    with pytest.raises(ValueError) as error:
        creds.set_server("nats://127.0.0.1:4222", None)
    assert str(error.value).startswith(f"{profile}: damaged (")
    assert "`gpuyard auth remove op.admin`, then `gpuyard auth init`" in str(error.value)


def test_the_servers_users_are_made_again_from_the_keys(tmp_path: Path) -> None:
    creds = Credentials(tmp_path, "c1")
    creds.init()
    users = tmp_path / "auth" / "users.conf"
    good = users.read_bytes()
    users.write_bytes(DAMAGE)
    assert not creds.init()  # (not new: nobody's key changes)
    assert users.read_bytes() == good


def test_a_damaged_local_profile_is_named_not_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no connection option, a command reads the cluster's operator profile: a damaged one
    is an error naming it (it went on to the default server, `nats://127.0.0.1:4222`)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    creds = Credentials(tmp_path / "gpuyard" / "c1", "c1")
    creds.init()
    creds.set_server("nats://127.0.0.1:14999", None)
    assert local_profile("c1") == creds.profile_path(OPERATOR)
    creds.profile_path(OPERATOR).write_bytes(DAMAGE)
    assert local_profile("c1") == creds.profile_path(OPERATOR)
    parser = argparse.ArgumentParser()
    add_nats_options(parser)
    args = parser.parse_args(["--cluster", "c1"])
    with pytest.raises(CommandError) as error:
        resolve_options(args)
    assert str(error.value).startswith(
        f"the cluster's profile {creds.profile_path(OPERATOR)}: not a connection profile (JSON)"
    )

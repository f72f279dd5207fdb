"""TLS by default beyond loopback (issue 40, item 11): `gpuyard up --listen` on an address other
than loopback makes the cluster's CA (once, kept across restarts) and a server certificate for the
names it is reached by, and every profile carries the CA, so clients verify the server; a client
without the CA does not connect; on loopback `up` stays plain."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import signal
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from gpuyard.cli.cluster import _server_names, _wildcard_urls
from gpuyard.pki import cluster_tls, make_pki
from gpuyard.pki import main as pki_main
from gpuyard.shared.connection import NatsAuth, TlsFailure, connect
from tests.polling import free_port, run_gpuyard

CLUSTER = "tlsdef"


def local_address() -> str | None:
    """An address of this machine other than loopback (the route out; nothing is sent)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        address = s.getsockname()[0]
        if not address.startswith("127."):
            return address
    return None


def names_of(cert: Path) -> set[str]:
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    sans = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in sans}


def test_the_cluster_ca_is_made_once_and_signs_the_servers_names(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    ca, cert, key = cluster_tls(folder, ["192.0.2.7", "ctl.example"], CLUSTER)
    for secret in (folder / "ca.key", key):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert names_of(cert) == {"192.0.2.7", "ctl.example"}
    issued = x509.load_pem_x509_certificate(cert.read_bytes())
    issued.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.read_bytes()))
    # Python's own verification accepts it for those names (the SANs), under that CA only.
    context = ssl.create_default_context(cafile=str(ca))
    assert context.get_ca_certs()[0]["subject"] == (
        (("commonName", f"gpuyard cluster {CLUSTER} CA"),),
    )

    first_ca, first_cert = ca.read_bytes(), cert.read_bytes()
    cluster_tls(folder, ["192.0.2.7", "ctl.example"], CLUSTER)  # a restart: nothing new
    assert (ca.read_bytes(), cert.read_bytes()) == (first_ca, first_cert)
    cluster_tls(folder, ["192.0.2.8"], CLUSTER)  # another address: a new certificate, same CA
    assert ca.read_bytes() == first_ca and names_of(cert) == {"192.0.2.8"}
    x509.load_pem_x509_certificate(cert.read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(first_ca)
    )


def test_a_new_ca_gets_a_new_server_certificate(tmp_path: Path) -> None:
    """The CA made again (its files removed): the server's certificate, signed by the old one, is
    made again under the new one, not kept."""
    folder = tmp_path / "tls"
    cluster_tls(folder, ["192.0.2.7"], CLUSTER)
    (folder / "ca.pem").unlink()
    (folder / "ca.key").unlink()
    ca, cert, _ = cluster_tls(folder, ["192.0.2.7"], CLUSTER)
    x509.load_pem_x509_certificate(cert.read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca.read_bytes())
    )


def test_a_throwaway_pki_for_tests(tmp_path: Path) -> None:
    _, cert, key = make_pki(tmp_path, host="127.0.0.1", days=1)
    assert names_of(cert) == {"127.0.0.1"} and stat.S_IMODE(key.stat().st_mode) == 0o600
    left = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    assert left - datetime.datetime.now(datetime.UTC) < datetime.timedelta(days=2)


def test_the_same_files_for_a_server_of_ones_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert pki_main([str(tmp_path / "tls"), "control", "10.0.0.5", "--cluster", CLUSTER]) == 0
    assert names_of(tmp_path / "tls" / "server.pem") == {"control", "10.0.0.5"}
    assert "ca.pem" in capsys.readouterr().out
    (tmp_path / "file").write_text("")
    assert pki_main([str(tmp_path / "file" / "tls"), "control"]) == 1  # one line, no traceback
    assert capsys.readouterr().err.count("\n") == 1


def test_a_server_on_every_interface_is_named_by_this_host() -> None:
    hostname = socket.gethostname()
    names = _server_names("0.0.0.0")
    assert hostname in names and "127.0.0.1" in names and "0.0.0.0" not in names
    assert _server_names("192.0.2.7")[:2] == ["192.0.2.7", hostname]
    # Services here reach it over loopback (in its names); profiles carry the host's name.
    assert _wildcard_urls("tls://0.0.0.0:4222") == (
        "tls://127.0.0.1:4222",
        f"tls://{hostname}:4222",
    )
    assert _wildcard_urls("tls://192.0.2.7:4222") == ("tls://192.0.2.7:4222",) * 2


class Up:
    def __init__(self, root: Path, listen_host: str) -> None:
        self.root = root
        self.state = root / "state"
        self.listen = f"{listen_host}:{free_port()}"
        self.proc: subprocess.Popen[str] | None = None

    def gpuyard(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_gpuyard(*args, cwd=self.root, check=False)

    def start(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", "up", "--cluster", CLUSTER, "--state-dir",
             str(self.state), "--listen", self.listen, "--round", "0.5"],
            stdout=subprocess.PIPE, stderr=(self.root / "up.log").open("a"), text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(timeout=30) == 0
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        self.proc = None

    def profile(self, name: str) -> dict[str, str]:
        return json.loads((self.state / "profiles" / f"{name}.json").read_text())


@pytest.fixture
def remote_up(tmp_path: Path) -> Iterator[Up]:
    address = local_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback")
    up = Up(tmp_path, address)
    try:
        yield up
    finally:
        up.stop()


@pytest.mark.slow
def test_up_beyond_loopback_serves_tls_with_its_own_ca(remote_up: Up) -> None:
    up = remote_up
    said = up.start()
    assert said.startswith(f"gpuyard control plane up: --nats tls://{up.listen} "), said
    ca = up.state / "tls" / "ca.pem"
    for secret in ("ca.key", "server.key"):
        assert stat.S_IMODE((up.state / "tls" / secret).stat().st_mode) == 0o600
    assert up.listen.rsplit(":", 1)[0] in names_of(up.state / "tls" / "server.pem")
    # Every profile carries the CA itself (a node's, copied to its machine, needs no other file).
    added = up.gpuyard("auth", "add-user", "alice", "--cluster", CLUSTER, "--state-dir",
                       str(up.state), "--out", str(up.root / "alice.json"))  # fmt: skip
    assert added.returncode == 0, added.stderr
    alice = json.loads((up.root / "alice.json").read_text())
    for profile in (alice, up.profile("op.admin"), up.profile("svc.scheduler")):
        assert (profile["url"], profile["tls_ca"]) == (f"tls://{up.listen}", ca.read_text())

    # A client with the profile verifies the server and submits; one without the CA is refused.
    submitted = up.gpuyard("submit", "--nats-config", str(up.root / "alice.json"), "--", "true")
    assert submitted.returncode == 0 and submitted.stdout.startswith("submitted "), submitted.stderr

    async def without_the_ca() -> None:
        auth = NatsAuth(identity="user.alice", seed=alice["seed"], tls_ca=None)
        await connect(
            f"tls://{up.listen}", name="no-ca", auth=auth, tls=ssl.create_default_context(),
            allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3,
        )  # fmt: skip

    with pytest.raises(TlsFailure, match="the server's certificate is not trusted"):
        asyncio.run(without_the_ca())

    # `up` again on its state directory: the same CA (profiles issued before keep working).
    up.stop()
    first = ca.read_bytes()
    assert up.start().startswith(f"gpuyard control plane up: --nats tls://{up.listen} ")
    assert ca.read_bytes() == first
    listed = up.gpuyard("jobs", "--json", "--nats-config", str(up.root / "alice.json"))
    assert listed.returncode == 0 and json.loads(listed.stdout)["total"] == 1, listed.stderr


def test_up_on_loopback_stays_plain(tmp_path: Path) -> None:
    up = Up(tmp_path, "127.0.0.1")
    try:
        said = up.start()
        assert said.startswith("gpuyard control plane up: --nats nats://127.0.0.1:"), said
        assert not (up.state / "tls").exists()
        assert up.profile("op.admin").get("tls_ca") is None
    finally:
        up.stop()

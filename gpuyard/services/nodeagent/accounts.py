"""Who a job runs as: nobody who holds a secret.

As Slurm runs a job as its submitter, a submitter the node maps to a Unix account (`--map-user
alice=alice`) runs as that account; every other job runs as the node's job account (`--job-user`,
default `gpuyard-job` where it exists, else `nobody`). Never as root, never as the agent's own
account (which holds the node's credentials), and the agent refuses to start when any of these
accounts could read a secret: its credentials, or a control plane's state on this machine.

An agent that is not root cannot switch accounts: it refuses to start unless told that its jobs
may run as itself (`--jobs-as-agent-user`, for a machine whose every submitter may act as this
node); even then a control plane's state must stay out of their reach.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_JOB_ACCOUNTS = ("gpuyard-job", "nobody")
"""The job account when none is named: the first of these that exists."""

_ACL = "system.posix_acl_access"


@dataclass(frozen=True)
class Account:
    """A Unix account a job's processes take (their user, group and supplementary groups)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, name: str) -> Account:
        """ValueError (one line) for an account this machine does not have."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"there is no Unix account {name!r} on this machine") from None
        return cls.of(entry)

    @classmethod
    def of(cls, entry: pwd.struct_passwd) -> Account:
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    def may(self, st: os.stat_result, want: int) -> bool:
        """Whether the mode bits of `st` give this account `want` (an `os.R_OK`/`X_OK` mask)."""
        if self.uid == 0:
            return True
        if st.st_uid == self.uid:
            shift = 6
        elif st.st_gid in self.groups:
            shift = 3
        else:
            shift = 0
        return (st.st_mode >> shift) & want == want


def reachable(path: Path, account: Account, want: int = os.R_OK) -> str:
    """Why `account` can open `path` for `want` (the component that grants more than its bits
    say, or ""): every folder above it must let the account in (x) and the file itself must give
    `want`. A component with an ACL counts as reachable (its bits do not tell who may)."""
    try:
        real = Path(os.path.realpath(path))
        parts = [*reversed(real.parents), real]
        for i, part in enumerate(parts):
            st = os.stat(part)
            need = want if i == len(parts) - 1 else os.X_OK
            if _has_acl(part):
                continue  # (the bits are not the whole answer: assume the worst)
            if not account.may(st, need):
                return ""
    except OSError:
        return ""  # gone, or not ours to look at: not reachable through this path
    return str(real)


def _plain_file(path: Path) -> bool:
    """(not a link, a socket or a pipe; False for one gone since the folder was listed)"""
    with contextlib.suppress(OSError):
        return stat.S_ISREG(os.lstat(path).st_mode)
    return False


def _has_acl(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return _ACL in os.listxattr(path)
    return False


def readable_files(roots: Iterable[Path], account: Account) -> Iterator[Path]:
    """The files under `roots` (files, or folders walked) that `account` can read. A folder the
    account cannot enter hides everything beneath it, so it is not walked."""
    for root in roots:
        if not root.exists():
            continue
        if not root.is_dir():
            if reachable(root, account):
                yield root
            continue
        if not reachable(root, account, os.X_OK):
            continue
        for folder, dirs, files in os.walk(root):
            base = Path(folder)
            dirs[:] = [d for d in dirs if reachable(base / d, account, os.X_OK)]
            for name in files:
                if _plain_file(base / name) and reachable(base / name, account):
                    yield base / name


@dataclass(frozen=True)
class JobAccounts:
    """The accounts this node's jobs run as: `by_user` for mapped submitters, else `default`.
    `None` is the agent's own account (a non-root agent told `--jobs-as-agent-user`)."""

    default: Account | None
    by_user: dict[str, Account]

    def for_user(self, user: str) -> Account | None:
        return self.by_user.get(user, self.default)

    @classmethod
    def resolve(
        cls, job_user: str, user_accounts: dict[str, str], jobs_as_agent_user: bool, *,
        credentials: Iterable[str], control_planes: Iterable[str], job_folders: Iterable[str],
    ) -> JobAccounts:  # fmt: skip
        """The accounts, checked: ValueError with one line saying what is wrong and what to do.

        `credentials`: the agent's own secret files; `control_planes`: files and folders of
        control planes on this machine (every file beneath is kept from jobs); `job_folders`:
        folders every job account must be able to enter (its checkpoints and progress)."""
        agent = Account.of(pwd.getpwuid(os.geteuid()))
        if agent.uid != 0:
            if not jobs_as_agent_user:
                raise ValueError(
                    f"the agent runs as {agent.name!r}, not root, so it cannot run jobs as "
                    "another account, and a job running as the agent could read its credentials: "
                    "run it as root (jobs then run as --job-user or a --map-user account), or "
                    "pass --jobs-as-agent-user on a machine whose every submitter may act as "
                    "this node"
                )
            if job_user or user_accounts:
                raise ValueError(
                    "--job-user and --map-user need an agent running as root (only root can "
                    "start a process as another account)"
                )
            # Its own credentials are its jobs' to read (so it was told): a control plane's not.
            cls._refuse_readable(agent, control_planes)
            return cls(None, {})
        if jobs_as_agent_user:
            raise ValueError(
                "--jobs-as-agent-user: the agent runs as root, and no job runs as root"
            )
        default = Account.named(job_user) if job_user else _default_job_account()
        by_user = {user: Account.named(name) for user, name in sorted(user_accounts.items())}
        accounts = cls(default, by_user)
        for account in {default, *by_user.values()}:
            if account.uid == 0:
                raise ValueError(f"Unix account {account.name!r} has uid 0: no job runs as root")
            cls._refuse_readable(account, [*credentials, *control_planes])
            for folder in job_folders:
                if not reachable(Path(folder), account, os.X_OK):
                    raise ValueError(
                        f"job account {account.name!r} cannot enter {folder} (where its "
                        "checkpoints and progress go): every folder above it must let others "
                        "in (mode o+x)"
                    )
        return accounts

    @staticmethod
    def _refuse_readable(account: Account, secrets: Iterable[str]) -> None:
        found = next(readable_files((Path(s) for s in secrets), account), None)
        if found is not None:
            raise ValueError(
                f"jobs would run as {account.name!r}, which can read {found}: a secret of this "
                "node or of the control plane; make it readable by its owner only (chmod 600, "
                "and 700 on its folder) or run jobs as another account"
            )


def _default_job_account() -> Account:
    for name in DEFAULT_JOB_ACCOUNTS:
        with contextlib.suppress(ValueError):
            return Account.named(name)
    raise ValueError(
        f"none of the job accounts {', '.join(DEFAULT_JOB_ACCOUNTS)} exists: create one "
        "(useradd --system --no-create-home gpuyard-job) or name one with --job-user"
    )

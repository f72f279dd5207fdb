"""Who acts: the identity a message is sent for, carried in its subject.

NATS tells a subscriber nothing about who published a message, so every request that acts for
someone names them in its subject (`gpuyard.<c>.sched.cancel.user.alice`,
`gpuyard.<c>.sched.exited.node.n1`), and the server's permissions let each identity publish only
subjects that end with its own token (gpuyard/natsauth.py). The service that receives the request
reads the identity back from the subject (`Caller`) and checks the body against it: a node reports
only its own exits, a user cancels only their own jobs.

An identity is `<role>.<name>`: `op.<name>` (operators), `user.<name>` (submitters),
`node.<id>` (node agents), `svc.<service>` (admission, scheduler, placement, simclock). Its
replies come to its own inbox prefix, `_INBOX.<role>.<name>`, which no other identity may read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, cast

from .roster import SERVICES

Role = Literal["op", "user", "node", "svc"]
ROLES: tuple[Role, ...] = ("op", "user", "node", "svc")
ROLE_NAMES = {"op": "operator", "user": "submitter", "node": "node agent", "svc": "service"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


@dataclass(frozen=True)
class Caller:
    """The identity a request acts for: `Caller("node", "n1")`, token `node.n1`."""

    role: Role
    name: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {', '.join(ROLES)}")
        if not _NAME.match(self.name):
            raise ValueError(
                f"identity name {self.name!r} must be 1-63 letters, digits, '-' or '_' "
                "(starting with a letter or digit)"
            )
        if self.role == "svc" and self.name not in SERVICES:
            raise ValueError(f"service {self.name!r} is not one of {', '.join(SERVICES)}")

    @property
    def token(self) -> str:
        """The two subject tokens that name it (`user.alice`)."""
        return f"{self.role}.{self.name}"

    @property
    def inbox_prefix(self) -> str:
        """Where its replies come: `_INBOX.user.alice` (its replies `_INBOX.user.alice.<id>...`)."""
        return f"_INBOX.{self.token}"

    @classmethod
    def parse(cls, text: str) -> Caller:
        """`user.alice` -> Caller("user", "alice"); ValueError naming what is wrong."""
        role, sep, name = text.partition(".")
        if not sep:
            raise ValueError(f"identity {text!r} is not ROLE.NAME (roles: {', '.join(ROLES)})")
        return cls(cast(Role, role), name)  # (a role not in ROLES is refused there)

    def __str__(self) -> str:
        return self.token


ANONYMOUS = Caller("op", "anonymous")
"""The identity of a client that names none: on a server without auth (a laptop, a simulation)
anyone may act as anyone, so it acts as an operator; on a secured server no user may publish as it."""

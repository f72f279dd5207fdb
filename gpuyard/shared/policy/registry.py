"""Policies by name: built-ins and third-party ones alike come from entry points."""

from __future__ import annotations

import contextlib
import re
import typing
from collections.abc import Collection, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

import msgspec

from ..options import key_values
from .interfaces import AdmissionPolicy, PlacementPolicy, Policy, SchedulingPolicy

P = TypeVar("P", bound=Policy)
V = TypeVar("V")


class PolicyError(ValueError):
    """An unknown policy or bad parameters; the message names what is wrong."""


def _allowed(tp: Any) -> list[Any]:
    """The values a Literal (or Optional Literal) type allows; [] for other types."""
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    return [v for arg in typing.get_args(tp) for v in _allowed(arg)]


_COMPOUND = (
    msgspec.inspect.DictType,
    msgspec.inspect.ListType,
    msgspec.inspect.TupleType,
    msgspec.inspect.StructType,
    msgspec.inspect.VarTupleType,
)


def _structured(params: Mapping[str, Any], cls: type[msgspec.Struct]) -> dict[str, Any]:
    """`params` with the command line's JSON text decoded where the field holds a mapping or a
    list (`--param costs='{"v100": 2.5}'`); other strings are converted by type later."""
    info = msgspec.inspect.type_info(cls)
    compound = {
        f.name for f in getattr(info, "fields", ())
        if isinstance(f.type, _COMPOUND) or (
            isinstance(f.type, msgspec.inspect.UnionType)
            and any(isinstance(t, _COMPOUND) for t in f.type.types)
        )
    }  # fmt: skip
    out = dict(params)
    for name in compound & out.keys():
        # not JSON: the conversion that follows names the field and the type it expects
        if isinstance(out[name], str):
            with contextlib.suppress(msgspec.DecodeError):
                out[name] = msgspec.json.decode(out[name])
    return out


class Registry(Generic[P]):
    """Policies of one kind by name (entry-point group `gpuyard.<kind>`)."""

    def __init__(self, kind: str, base: type[P]) -> None:
        self.kind = kind
        self.base = base
        self._classes: dict[str, type[P]] = {}
        self._entry_points: dict[str, EntryPoint] | None = None
        """By name; each is imported when first asked for (a process needs one or two of them,
        and importing them all took a third of a second at every start)."""

    @property
    def group(self) -> str:
        return f"gpuyard.{self.kind}"

    def register(self, name: str, cls: type[P]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PolicyError(f"{self.kind} policy {name!r}: {cls!r} is not a {self.base.__name__}")
        self._classes[name] = cls

    def _installed(self, *, again: bool = False) -> dict[str, EntryPoint]:
        if self._entry_points is None or again:
            self._entry_points = {ep.name: ep for ep in entry_points(group=self.group)}
        return self._entry_points

    def names(self) -> list[str]:
        return sorted(self._classes.keys() | self._installed().keys())

    def get(self, name: str) -> type[P]:
        if name not in self._classes:
            ep = self._installed().get(name) or self._installed(again=True).get(name)
            if ep is None:  # (looked again: a package installed since)
                raise PolicyError(
                    f"unknown {self.kind} policy {name!r}; known: {', '.join(self.names()) or 'none'}"
                )
            self.register(name, ep.load())
        return self._classes[name]

    def create(self, name: str, params: Mapping[str, Any] | None = None) -> P:
        """Instantiate by name; string values (from a command line) are converted to the field types."""
        cls = self.get(name)
        try:
            parsed = msgspec.convert(
                _structured(params or {}, cls.Params), cls.Params, strict=False
            )
        except msgspec.ValidationError as exc:
            fields = {f.name: f.type for f in msgspec.structs.fields(cls.Params)}
            text = str(exc)
            at = re.search(r"`\$\.(\w+)", text)
            allowed = _allowed(fields[at[1]]) if at and at[1] in fields else []
            if allowed:
                text += f" (valid: {', '.join(map(str, allowed))})"
            raise PolicyError(
                f"{self.kind} policy {name!r}: bad parameter: {text} "
                f"(parameters: {', '.join(fields) or 'none'})"
            ) from None
        return cls(parsed)


scheduling_policies: Registry[SchedulingPolicy] = Registry("scheduling", SchedulingPolicy)
admission_policies: Registry[AdmissionPolicy] = Registry("admission", AdmissionPolicy)
placement_policies: Registry[PlacementPolicy] = Registry("placement", PlacementPolicy)


def parse_params(pairs: list[str]) -> dict[str, str]:
    """`["k=v", ...]` from a command line into a dict; the values are converted by `Registry.create`."""
    try:
        given = key_values("parameter", pairs)
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    return {key.strip(): value.strip() for key, value in given.items()}


def own_params(policy: str, params: dict[str, V]) -> dict[str, V]:
    """The parameters of `params` that `policy` takes: `key` applies to every policy,
    `policy.key` to that policy only (`gpuyard sim --policy fifo,las --param las.key=rounds`, a
    sweep's grid of policies that share one file)."""
    own: dict[str, V] = {}
    for key, value in params.items():
        scope, dot, name = key.partition(".")
        if not dot:
            own[key] = value
        elif scope == policy:
            own[name] = value
    return own


class PolicyChoice(msgspec.Struct, frozen=True, kw_only=True):
    """A policy by name, with its parameters (typed, or text from a command line)."""

    name: str
    params: dict[str, Any] = {}


class PolicySet(msgspec.Struct, frozen=True, kw_only=True):
    """The three policies of a control plane, each with its parameters."""

    scheduling: PolicyChoice
    admission: PolicyChoice
    placement: PolicyChoice

    def by_service(self) -> list[tuple[str, Registry[Any], PolicyChoice]]:
        """(service, registry, choice) for the scheduler, admission and placement."""
        return [
            ("scheduler", scheduling_policies, self.scheduling),
            ("admission", admission_policies, self.admission),
            ("placement", placement_policies, self.placement),
        ]

    def made(self, skip: Collection[str] = ()) -> dict[str, Policy]:
        """Each policy made through its registry, by service, but those of the services in
        `skip` (run elsewhere, with policies of their own); PolicyError names a bad one."""
        return {
            service: registry.create(choice.name, choice.params)
            for service, registry, choice in self.by_service()
            if service not in skip
        }

    def seeded(self, seed: int) -> PolicySet:
        """This set with `seed` as the `seed` parameter of each policy that has one and was not
        given it."""
        changes: dict[str, PolicyChoice] = {}
        for _, registry, choice in self.by_service():
            params = registry.create(choice.name, choice.params).params
            if (
                "seed" not in choice.params
                and params is not None
                and "seed" in params.__struct_fields__
            ):
                changes[registry.kind] = PolicyChoice(
                    name=choice.name, params={**choice.params, "seed": seed}
                )
        return msgspec.structs.replace(self, **changes)

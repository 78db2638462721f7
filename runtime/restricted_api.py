"""Triton's endpoint restrictions: API groups answered only to requests carrying a header key and value.

``--http-restricted-api=<group>[,<group>...]:<key>=<value>`` and ``--grpc-restricted-protocol=...`` (repeatable, one
key per group).  Checked against Triton 2.51: a restricted HTTP call without the header (its name in any case, its
value exact) is answered 403 ``This API is restricted, expecting header '<key>'``, whatever its method or model; over
gRPC the metadata key is ``triton-grpc-protocol-<key>`` and the answer UNAVAILABLE ``This protocol is restricted,
expecting header 'triton-grpc-protocol-<key>'``.  Which endpoint belongs to which group is the adapters' to say
(``runtime.http.restricted``, ``runtime.grpc.server``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
              "trace", "logging")


@dataclass(frozen=True)
class Restriction:
    """The header a request to a restricted group must carry."""

    key: str
    value: str


@dataclass(frozen=True)
class RestrictedApis:
    """Each restricted group's header (groups not named are open)."""

    by_group: dict[str, Restriction] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Iterable[str], option: str) -> RestrictedApis:
        """``specs`` as the option gives them; ValueError naming ``option`` and what is wrong."""
        by_group: dict[str, Restriction] = {}
        for spec in specs:
            groups, separator, header = spec.partition(":")
            key, equals, value = header.partition("=")
            if not separator or not equals or not key or not groups:
                raise ValueError(f"{option} '{spec}': expected <API>[,<API>...]:<key>=<value>")
            if not (key.isascii() and key.isprintable() and value.isascii() and value.isprintable()) or " " in key:
                raise ValueError(f"{option} '{spec}': the header's key and value must be printable ASCII (no space "
                                 "in the key)")
            for group in groups.split(","):
                if group not in API_GROUPS:
                    raise ValueError(f"{option} '{spec}': unknown API '{group}' (one of {', '.join(API_GROUPS)})")
                if group in by_group:
                    raise ValueError(f"{option}: API '{group}' is restricted more than once")
                by_group[group] = Restriction(key, value)
        return cls(by_group)

    def __bool__(self) -> bool:
        return bool(self.by_group)

    def restriction(self, group: str | None) -> Restriction | None:
        return self.by_group.get(group) if group is not None else None

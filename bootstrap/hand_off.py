"""The settings handed to the runtime: each option record is built from the settings declared ``into`` its fields
(bootstrap/settings_schema.py), so that a new setting is its declaration and its use, with no record in between
to copy it through. What comes from several settings, or from elsewhere (the repository source, the backends), is
given by the caller (bootstrap/cli.py)."""

from __future__ import annotations

from typing import Any, TypeVar

from bootstrap.settings_schema import declared

Record = TypeVar("Record")

# the records settings are handed into, by the name their ``into`` paths use
RECORDS = ("server", "adapters", "http", "grpc", "on_demand")


def handed_into(settings: Any, record: str) -> dict[str, Any]:
    """The values of the settings declared into ``record``'s fields, by field."""
    values: dict[str, Any] = {}
    for name, setting in declared(type(settings)):
        for target in setting.into:
            where, _, field_name = target.partition(".")
            if where == record:
                values[field_name] = getattr(settings, name)
    return values


def hand_off(settings: Any, record: str, cls: type[Record], **given: Any) -> Record:
    """``cls`` built from the settings declared into ``record`` and ``given`` (a field neither names keeps its
    default); ValueError where both name a field."""
    values = handed_into(settings, record)
    both = values.keys() & given.keys()
    if both:
        raise ValueError(f"{record}: {sorted(both)} both declared into by a setting and given")
    return cls(**values, **given)

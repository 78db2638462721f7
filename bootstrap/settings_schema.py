"""The settings schema: each setting is declared once, as a dataclass field carrying its function.yaml key, its
check, its command-line flags and its README text, and the function.yaml parser, the flags, the defaults and the
README's settings table are all read off those declarations (so none of them can drift from the others)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bootstrap.errors import BootstrapError

Check = Callable[[Any, str], Any]  # (a value from function.yaml or a flag, its name for messages) -> the value
_SCHEMA = "settings_schema"


class SettingsError(BootstrapError, ValueError):
    """function.yaml is missing, malformed or holds an invalid value."""


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets a setting: ``convert`` turns its text into the value the setting's check then
    reads (None: a flag taking no argument, which sets ``const``); ``bare``: the text a flag given with none takes
    (a true-or-false flag typed alone means true); a repeatable flag adds to function.yaml's list (``adds``) or
    replaces it."""

    name: str
    help: str = ""
    convert: Callable[[str], Any] | None = str
    const: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    repeatable: bool = False
    adds: bool = True
    commands: tuple[str, ...] = ("run",)
    bare: str | None = None
    words: bool = False  # the flag takes one or more words, joined by spaces (Triton's frontend's nargs=3 flag)

    @property
    def dest(self) -> str:
        return "flag_" + self.name.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Setting:
    key: str  # where function.yaml holds it: "server.http_port"
    check: Check
    meaning: str  # the README's words
    shown_default: str | None = None  # the README's default column, where the value itself does not say it
    flags: tuple[Flag, ...] = ()
    into: tuple[str, ...] = ()  # the runtime's option fields it goes to, "<record>.<field>" (bootstrap/hand_off.py)


def setting(default: Any = dataclasses.MISSING, *, key: str, check: Check, meaning: str,
            factory: Callable[[], Any] | None = None, shown: str | None = None, flags: Sequence[Flag] = (),
            into: str | Sequence[str] = ()) -> Any:
    """A dataclass field declared as a setting (``factory``: a default computed when the settings are made;
    ``into``: where the runtime's options take its value, bootstrap/hand_off.py)."""
    declared = {_SCHEMA: Setting(key, check, meaning, shown, tuple(flags), (into,) if isinstance(into, str)
                                 else tuple(into))}
    if factory is not None:
        return field(default_factory=factory, metadata=declared)
    return field(default=default, metadata=declared)


def declared(cls: type) -> Iterator[tuple[str, Setting]]:
    """(attribute, setting) for every setting field of a settings dataclass, in declaration order."""
    for item in dataclasses.fields(cls):
        schema = item.metadata.get(_SCHEMA)
        if schema is not None:
            yield item.name, schema


# -- checks: each takes the value and the name to blame, returns the value to keep -----------------------------

def port(value: Any, name: str) -> int | None:
    if value is None or value is False:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise SettingsError(f"{name} must be a port number (0-65535) or null to disable, got {value!r}")
    return value


def positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SettingsError(f"{name} must be a positive integer")
    return value


def _whole_number(value: Any, name: str, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SettingsError(f"{name} must be {what}")
    return value


def count_or_zero(value: Any, name: str) -> int:
    return _whole_number(value, name, "a whole number (0 or more)")


def byte_count(value: Any, name: str) -> int:
    return _whole_number(value, name, "a whole number of bytes")


def _seconds(value: Any, name: str, positive: bool) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or (positive and value == 0):
        raise SettingsError(f"{name} must be a {'positive' if positive else 'non-negative'} number of seconds")
    return float(value)


def seconds(value: Any, name: str) -> float:
    return _seconds(value, name, positive=True)


def seconds_or_zero(value: Any, name: str) -> float:
    return _seconds(value, name, positive=False)


def boolean(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{name} must be true or false")
    return value


def optional_boolean(value: Any, name: str) -> bool | None:
    return None if value is None else boolean(value, name)


def text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{name} must be a non-empty string")
    return value


def optional_text(value: Any, name: str) -> str | None:
    return None if value is None else text(value, name)


def one_of(*choices: str) -> Check:
    def check(value: Any, name: str) -> str:
        if value not in choices:
            raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def text_list(what: str) -> Check:
    """A list of non-empty strings (``what`` says their form in the message)."""
    def check(value: Any, name: str) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) and item for item in value):
            raise SettingsError(f"{name} must be a list of {what}")
        return tuple(value)
    return check


def true_or_false(text_value: str) -> bool:
    """A flag's ``true`` / ``false``."""
    if text_value not in ("true", "false"):
        raise ValueError(text_value)
    return text_value == "true"


# -- function.yaml -------------------------------------------------------------------------------------------

def sections(classes: Iterable[type]) -> dict[str, set[str]]:
    """The keys function.yaml may hold: section -> keys ('' for the top level)."""
    known: dict[str, set[str]] = {"": set()}
    for cls in classes:
        for _, schema in declared(cls):
            section, _, key = schema.key.rpartition(".")
            known.setdefault(section, set()).add(key)
            if section:
                known[""].add(section)
    return known


def check_keys(data: dict, known: dict[str, set[str]]) -> None:
    """Unknown keys and sections that are not mappings, named."""
    unknown = sorted(set(data) - known[""])
    if unknown:
        raise SettingsError(f"unknown function.yaml keys: {unknown}")
    for section, keys in known.items():
        if not section:
            continue
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise SettingsError(f"'{section}' must be a mapping")
        unknown = sorted(set(value) - keys)
        if unknown:
            raise SettingsError(f"unknown keys in '{section}': {unknown}")


def read_file_values(cls: type, data: dict) -> dict[str, Any]:
    """The checked values function.yaml gives for ``cls``'s settings, by attribute (absent keys: not there)."""
    values: dict[str, Any] = {}
    for attribute, schema in declared(cls):
        section, _, key = schema.key.rpartition(".")
        holder = (data.get(section) or {}) if section else data
        if key in holder:
            values[attribute] = schema.check(holder[key], schema.key)
    return values


# -- flags ---------------------------------------------------------------------------------------------------

def add_flags(parser: argparse.ArgumentParser, command: str, classes: Iterable[type]) -> None:
    """Every flag of ``command`` that the declared settings name (its text converted as it is read)."""
    for cls in classes:
        for _, schema in declared(cls):
            for flag in schema.flags:
                if command not in flag.commands:
                    continue
                if flag.convert is None:
                    parser.add_argument(flag.name, dest=flag.dest, action="store_true", help=flag.help)
                    continue
                metavar = flag.metavar or schema.key.rpartition(".")[2].upper()
                choices = None
                if flag.choices:
                    choices = [flag.convert(choice) for choice in flag.choices]
                    metavar = "{" + ",".join(flag.choices) + "}"
                bare = {} if flag.bare is None else {"nargs": "?", "const": flag.convert(flag.bare)}
                if flag.words:
                    bare = {"nargs": "+"}
                parser.add_argument(flag.name, dest=flag.dest, action="append" if flag.repeatable else "store",
                                    type=_argument_type(flag), choices=choices, metavar=metavar, help=flag.help,
                                    **bare)


def _argument_type(flag: Flag) -> Callable[[str], Any]:
    """``flag.convert`` as argparse calls it: a text it cannot read is a usage error that names the flag."""
    convert = flag.convert
    assert convert is not None

    def converted(given: str) -> Any:
        try:
            return convert(given)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) if isinstance(exc, SettingsError) else
                                             f"cannot be {given!r}") from None
    return converted


def apply_flags(target: Any, args: argparse.Namespace) -> None:
    """Set ``target``'s settings from the flags given (each checked as its function.yaml value is)."""
    for attribute, schema in declared(type(target)):
        for flag in schema.flags:
            given = getattr(args, flag.dest, None)
            if given is None or given is False and flag.convert is None:  # not given (a switch: not set)
                continue
            if flag.words:  # each use's words as one text
                given = [" ".join(words) for words in given] if flag.repeatable else " ".join(given)
            if flag.convert is None:
                value = flag.const
            elif flag.repeatable and flag.adds:
                value = [*getattr(target, attribute), *given]
            else:
                value = given
            setattr(target, attribute, schema.check(value, flag.name))


# -- the README's table ----------------------------------------------------------------------------------------

def _shown(value: Any) -> str:
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def table_rows(cls: type) -> Iterator[str]:
    """A row per setting, in declaration order; a field holding another settings dataclass: its rows, there."""
    for item in dataclasses.fields(cls):
        schema = item.metadata.get(_SCHEMA)
        if schema is None:
            nested = item.default_factory
            if isinstance(nested, type) and dataclasses.is_dataclass(nested):
                yield from table_rows(nested)
            continue
        default = schema.shown_default
        if default is None:
            factory = item.default_factory
            value = item.default if item.default is not dataclasses.MISSING else (
                factory() if callable(factory) else None)
            default = _shown(value)
        meaning = schema.meaning
        flags = [flag.name for flag in schema.flags]
        if flags:
            meaning += f" ({', '.join(f'`{name}`' for name in flags)})"
        yield f"| `{schema.key}` | {meaning} | {default} |"


def settings_table(cls: type) -> str:
    """The README's settings table (Markdown): every setting of ``cls`` a row."""
    return "\n".join(["| field | meaning | default |", "| --- | --- | --- |", *table_rows(cls)]) + "\n"

"""The values of a `.json` argument file (`python run_qa.py args.json`) checked against the types of their fields.

`HfArgumentParser.parse_dict` hands JSON values to the dataclasses as they are: `"do_train": "false"` is a non-empty
string, so it trains; `"learning_rate": "abc"` or `null` for a length end in a `TypeError` deep inside. Here each value
takes the path its flag takes on the command line: a string goes through the flag's own type (so `"false"`, `"no"`,
`"0"` mean false for a boolean, exactly as `--do_train false`, and `"3e-5"` is a float), a JSON boolean or number must
be of the field's type, a list only where the flag takes several values, `null` only where the field's default is
`None` (or its type says `Optional`). Anything else is one `ValueError` naming the file, the key, the value and the
type wanted, which `run_script` turns into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from transformers.hf_argparser import string_to_bool

from optimum_ipu.errors import short_repr

_JSON_KIND = {bool: "a JSON boolean (true/false)", int: "an integer", float: "a number", str: "a string"}


def _hints(dataclass_types: tuple[type, ...]) -> dict[str, Any]:
    """Each field's annotation, by name, over the script's dataclasses (an unresolvable one is left out)."""
    hints: dict[str, Any] = {}
    for dtype in dataclass_types:
        try:
            resolved = typing.get_type_hints(dtype)
        except Exception:  # a forward reference that does not resolve: that field is checked by its flag alone
            resolved = {}
        for f in dataclasses.fields(dtype):
            hints[f.name] = resolved.get(f.name, f.type)
    return hints


def _members(hint: Any) -> tuple[Any, ...]:
    """The types a hint admits: `int | None` -> `(int, NoneType)`; `dict[str, Any]` -> `(dict,)`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(m for arg in typing.get_args(hint) for m in _members(arg))
    return (typing.get_origin(hint) or hint,)


def _allows(hint: Any, kind: type) -> bool:
    return any(isinstance(m, type) and issubclass(m, kind) for m in _members(hint))


def _is_bool(action: argparse.Action) -> bool:
    return action.type is string_to_bool or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))


def _expected(action: argparse.Action) -> str:
    if _is_bool(action):
        return "a JSON boolean (true/false; the strings yes/no, true/false, t/f, y/n, 1/0 as on the command line)"
    if action.choices:
        return "one of " + ", ".join(str(c) for c in action.choices)
    kind = _JSON_KIND.get(action.type, f"a {getattr(action.type, '__name__', 'value')}")
    return f"a list of {kind.removeprefix('a ').removeprefix('an ')}s" if action.nargs in ("+", "*") else kind


def _scalar(action: argparse.Action, value: Any) -> Any:
    """`value` (one JSON scalar) as the flag's type converts it, or `ValueError` if it is not of that type."""
    if _is_bool(action):
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return string_to_bool(value)  # ArgumentTypeError if it is none of the command line's spellings
        raise ValueError
    if isinstance(value, str):
        converted = action.type(value) if callable(action.type) else value
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError
    elif action.type is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        converted = int(value)
    elif action.type is float:
        converted = float(value)
    else:
        converted = action.type(str(value)) if callable(action.type) else value
    if action.choices and converted not in action.choices:
        raise ValueError
    return converted


def _checked(action: argparse.Action, hint: Any, value: Any) -> Any:
    if value is None:
        if action.default is None or _allows(hint, type(None)):
            return None
        raise ValueError
    if isinstance(value, dict):
        if _allows(hint, dict):
            return value
        raise ValueError
    if isinstance(value, list):
        if action.nargs in ("+", "*"):
            return [_scalar(action, item) for item in value]
        if _allows(hint, list):
            return value
        raise ValueError
    return _scalar(action, value)


def checked_json_args(
    parser: argparse.ArgumentParser, dataclass_types: tuple[type, ...], values: dict[str, Any], source: str
) -> dict[str, Any]:
    """`values` (a JSON argument file's object, its keys already the flags' names) with each value converted as its
    flag converts a command-line string, or a `ValueError` naming `source`, the key, the value and the type wanted.
    Keys no field has are left to `parse_dict`, which names them."""
    if not isinstance(values, dict):
        raise ValueError(f"{source}: an argument file holds one JSON object of flag names; got {short_repr(values)}")
    hints = _hints(dataclass_types)
    out = {}
    for key, value in values.items():
        action = parser._option_string_actions.get(f"--{key}")
        if action is None or key not in hints:
            out[key] = value
            continue
        try:
            out[key] = _checked(action, hints[key], value)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise ValueError(
                f"{source}: {key!r}: {short_repr(value)} is not {_expected(action)}; give --{key} a value of that type"
            ) from None
    return out

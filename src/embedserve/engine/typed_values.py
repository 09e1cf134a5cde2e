"""Values of declared option fields (engine/options.py's `_option` fields): a string from a spec
or a file parsed by the field's type, any other value checked against it, with one error style
(`OptionError` naming the option); and each field's command-line flag. No torch here.

A field's type is bool, int, float, str (each maybe `| None`) or `tuple[str, ...]` (a list: on
the command line, several values after one flag; in a spec, comma-separated; in YAML, a list).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class OptionError(ValueError):
    """An engine option a surface does not know, or a value its type does not admit."""


def base_type(hint: Any) -> type:
    """int for `int | None`, tuple for `tuple[str, ...]`, and so on (the one non-None type)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    hint = typing.get_origin(hint) or hint
    assert isinstance(hint, type)
    return hint


def typed(f: dataclasses.Field[Any], hint: Any, value: object, where: str) -> Any:
    """`value` for field `f` (type `hint`), parsed and checked; OptionError naming the option."""
    name, meta, kind = f.name, f.metadata, base_type(hint)
    if kind is tuple:
        return _items(name, value, where)
    if isinstance(value, str):
        value = _parse(name, kind, value.strip(), where)
    elif kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise OptionError(f"{where}: option {name} must be {_expected(kind)}, got {value!r}")
    if meta["choices"] and value not in meta["choices"]:
        raise OptionError(
            f"{where}: option {name} must be one of {', '.join(meta['choices'])}, got {value!r}"
        )
    if meta["minimum"] is not None and isinstance(value, int) and value < meta["minimum"]:
        raise OptionError(f"{where}: option {name} must be an integer >= {meta['minimum']}, got {value}")
    if meta["fraction"] and isinstance(value, float) and not 0.0 < value <= 1.0:
        raise OptionError(f"{where}: option {name} must be a fraction in (0, 1], got {value}")
    if isinstance(value, str) and not value:
        raise OptionError(f"{where}: option {name} must not be empty")
    return value


def _items(name: str, value: object, where: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(v, str) and v.strip() for v in items):
        raise OptionError(f"{where}: option {name} must be a list of non-empty texts, got {value!r}")
    return tuple(v.strip() for v in items)


def _parse(name: str, kind: type, text: str, where: str) -> object:
    try:
        if kind is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(text)
        return kind(text)
    except ValueError:
        raise OptionError(f"{where}: option {name} must be {_expected(kind)}, got {text!r}") from None


def _expected(kind: type) -> str:
    return {bool: f"one of {'/'.join(_TRUE + _FALSE)}", int: "an integer", float: "a number"}.get(
        kind, "text"
    )


def positive_int(text: str) -> int:
    """argparse `type=` for counts and sizes: an integer >= 1, or a clear parser error."""
    return bounded_int(text, 1)


def bounded_int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def add_flag(g: argparse._ArgumentGroup, f: dataclasses.Field[Any], hint: Any) -> None:
    """Field `f`'s flag (default --field-name) on the command line."""
    meta = f.metadata
    flag = meta["flag"] or "--" + f.name.replace("_", "-")
    kw: dict[str, Any] = {"dest": f.name, "default": f.default, "help": meta["help"]}
    if meta["metavar"]:
        kw["metavar"] = meta["metavar"]
    kind = base_type(hint)
    if kind is bool:
        # A tri-state option (None: the model decides) takes --x / --no-x; a switch only --x.
        action = argparse.BooleanOptionalAction if f.default is None else "store_true"
        g.add_argument(flag, action=action, **kw)
        return
    if kind is tuple:
        g.add_argument(flag, nargs="+", type=str, **kw)
        return
    if meta["choices"]:
        kw["choices"] = meta["choices"]
    if kind is int and meta["minimum"] is not None:
        minimum = meta["minimum"]
        kw["type"] = lambda text: bounded_int(text, minimum)
    else:
        kw["type"] = kind
    g.add_argument(flag, **kw)

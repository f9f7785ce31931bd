"""A run's flags from typed values (parser dest -> value) instead of a command line: how
the Hugging Face converter states a model. Each value is checked and typed as its flag's
parser action would check and type the word on a command line (``type``, ``choices``,
``nargs``, on/off flags take a bool); the other flags keep the parser's defaults; then the
command line's own validation runs (a ``ConfigError`` names the flag). No torch import.
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping, Optional

from ...config import ConfigError
from ..config.validation import validate_args
from .arguments import apply_checkpoint_args, build_parser

_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction,
             argparse.BooleanOptionalAction)


def _flag(action: argparse.Action) -> str:
    return action.option_strings[0]


def _one(action: argparse.Action, value: Any) -> Any:
    kind = action.type or str
    try:
        typed = kind(value)
    except (TypeError, ValueError):
        typed = None
    if typed is None or typed != value or isinstance(value, bool):  # 0.5 is no int
        raise ConfigError(f"{_flag(action)}: expected {kind.__name__}, got {value!r}")
    if action.choices is not None and typed not in action.choices:
        raise ConfigError(f"{_flag(action)}: invalid choice: {typed!r} (choose from "
                          f"{', '.join(map(repr, action.choices))})")
    return typed


def typed_value(action: argparse.Action, value: Any) -> Any:
    """``value`` as the parser would store it for ``action``'s flag (ConfigError if the
    flag cannot take it)."""
    if isinstance(action, _SWITCHES):
        if not isinstance(value, bool):
            raise ConfigError(f"{_flag(action)} is on or off (a bool), not {value!r}")
        return value
    if action.nargs in (None, "?"):
        return _one(action, value)
    if not isinstance(value, (list, tuple)) or (action.nargs == "+" and not value):
        raise ConfigError(f"{_flag(action)} takes a list of values, not {value!r}")
    return [_one(action, v) for v in value]


def flags_of_values(values: Mapping[str, Any]) -> argparse.Namespace:
    """The parser's defaults with ``values`` ({dest: value}) in place, unvalidated."""
    parser = build_parser()
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    args = parser.parse_args([])
    for dest, value in values.items():
        if dest not in actions or dest == "help":
            raise ConfigError(f"no flag stores {dest!r}")
        setattr(args, dest, typed_value(actions[dest], value))
    return args


def read_values(values: Mapping[str, Any],
                world_size: Optional[int] = None) -> argparse.Namespace:
    """``arguments.read_args`` for ``values`` given as {dest: value} (those given are the
    flags written on a command line)."""
    args = flags_of_values(values)
    apply_checkpoint_args(args, set(values))
    return validate_args(args, world_size)

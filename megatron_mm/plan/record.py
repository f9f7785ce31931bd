"""Plans are data: dataclasses that round-trip through plain dicts and JSON.

The runtime that will execute a plan and the simulator that replays it read the same dicts,
so every plan type derives from ``Record`` and keeps to JSON types (str, int, float, bool,
None, lists, dicts of those, nested Records; an Enum is written as its value). Lists, never tuples:
JSON has no tuples, and a round trip must compare equal.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from typing import Any, Dict, Type, TypeVar, Union

from .errors import PlanError

R = TypeVar("R", bound="Record")


class Record:
    """Mixin for dataclasses: ``to_dict`` / ``from_dict`` / ``to_json`` / ``from_json``."""

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: Type[R], data: Dict[str, Any]) -> R:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise PlanError(f"{cls.__name__}: unknown fields {sorted(unknown)} "
                            f"(expected a subset of {sorted(names)})")
        hints = typing.get_type_hints(cls)
        return cls(**{k: _decode(hints[k], v) for k, v in data.items()})

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls: Type[R], text: str) -> R:
        return cls.from_dict(json.loads(text))


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # its value: JSON's own type (an action kind's letters)
        return value.value
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:  # Optional[X]
        inner = [a for a in args if a is not type(None)]
        return _decode(inner[0], value) if len(inner) == 1 else value
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise PlanError(f"unknown {hint.__name__} {value!r}; expected one of "
                            f"{[k.value for k in hint]}") from None
    if origin is list:
        return [_decode(args[0], v) for v in value]
    if origin is dict:
        return {k: _decode(args[1], v) for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # JSON writes 2.0 as 2.0, but hand-written dicts may say 2
    return value

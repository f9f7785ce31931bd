"""What the typed groups share: the metadata of a field that is not a flag, and a group read
from a dict of flag values (a parsed namespace's, or a checkpoint's saved args)."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Tuple

from ....config import ConfigError

from ....families.flags import FamilyFlags, flag  # noqa: F401 (flag: the groups' fields)

# A field validation derives (the world's sizes, the micro-batches per step) or one that
# holds other groups (the families' flags): no flag of its own.
DERIVED = {"derived": True}


def flag_fields(cls) -> Tuple[dataclasses.Field, ...]:
    """The fields of ``cls`` that are flags."""
    return tuple(f for f in dataclasses.fields(cls) if not f.metadata.get("derived"))


def derived_names(cls) -> Tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("derived"))


def from_values(cls, values: Mapping[str, Any]):
    """``cls`` with the fields ``values`` has (a flag missing there keeps its default: an old
    checkpoint saved before the flag existed); ``families`` from the same values."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.type == "FamilyFlags" or f.type is FamilyFlags:
            kwargs[f.name] = FamilyFlags.from_values(values)
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def to_values(group) -> dict:
    """A group's fields in one flat dict (Megatron-LM's attribute names); the families' flags
    flattened in beside the others, as the parser holds them."""
    out = {}
    for f in dataclasses.fields(group):
        value = getattr(group, f.name)
        if isinstance(value, FamilyFlags):
            out.update(value.values())
        else:
            out[f.name] = value
    return out


def flag_name(dest: str) -> str:
    """The flag of a field: ``--`` and its name with dashes."""
    return "--" + dest.replace("_", "-")


def not_positive(group, *names) -> List[ConfigError]:
    """"must be positive" for each of ``names`` set at or below 0 (None: not given)."""
    return [ConfigError(f"{flag_name(n)} must be positive") for n in names
            if getattr(group, n) is not None and getattr(group, n) <= 0]

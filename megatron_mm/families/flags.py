"""The encoder families' own flags: each family declares them as one dataclass (``flags`` of
its ``EncoderFamily``: each field a flag, its docstring the ``--help`` text), and the run's
model group holds one instance of each in ``FamilyFlags``, read by class."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Tuple, Type, TypeVar

T = TypeVar("T")


def flag(default=dataclasses.MISSING, *, default_factory=dataclasses.MISSING, **argparse_meta):
    """A field whose flag needs more than its type says: Megatron-LM's ``argparse_meta``
    (``arg_names``, ``choices``, ``nargs``, ``action``, ``type``, ``metavar``), read by
    its ``ArgumentGroupFactory``."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"argparse_meta": argparse_meta})


def flag_classes() -> Tuple[type, ...]:
    """Every registered family's flags dataclass, once each, in registry order."""
    from .registry import FAMILIES

    out = []
    for fam in FAMILIES.values():
        if fam.flags is not None and fam.flags not in out:
            out.append(fam.flags)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class FamilyFlags:
    """One instance of each registered family's flags dataclass; ``flags[Qwen2_5VLFlags]``
    is that family's (its defaults where the run did not set them)."""

    groups: Tuple[Any, ...] = ()

    def __getitem__(self, cls: Type[T]) -> T:
        for group in self.groups:
            if type(group) is cls:
                return group
        return cls()

    def replace(self, cls: type, **changes) -> "FamilyFlags":
        """These flags with ``cls``'s fields ``changes`` changed."""
        new = dataclasses.replace(self[cls], **changes)
        return FamilyFlags(tuple(g for g in self.groups if type(g) is not cls) + (new,))

    def values(self) -> Dict[str, Any]:
        """Every family's flags in one flat dict (the dests the parser holds them under)."""
        out: Dict[str, Any] = {}
        for cls in flag_classes():
            out.update(dataclasses.asdict(self[cls]))
        return out

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "FamilyFlags":
        groups = []
        for flags in flag_classes():
            names = [f.name for f in dataclasses.fields(flags)]
            groups.append(flags(**{n: values[n] for n in names if n in values}))
        return cls(tuple(groups))

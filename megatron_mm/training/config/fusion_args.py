"""Megatron-LM's ``--no-*-fusion`` flags, with its dests and meanings
(``megatron/training/arguments.py``): each fusion is on unless turned off, and runs where
its kernel exists (``models/fusions.py``). No torch import."""

from __future__ import annotations

import dataclasses
from typing import Dict

from .groups.fusion import FusionArgs

# dest -> flag, from the group's fields
FUSION_FLAGS = {f.name: f.metadata["argparse_meta"]["arg_names"][0]
                for f in dataclasses.fields(FusionArgs)}


def fusion_flags(fusion) -> Dict[str, bool]:
    """The flags' values (``fusion``: the RunConfig's fusion group)."""
    return {dest: getattr(fusion, dest) for dest in FUSION_FLAGS}

"""Encoder data parallelism over CP ranks (``--vision-dp-when-cp``): which media items of
a micro-batch each context-parallel rank encodes.

Without it every CP rank encodes every item of the micro-batch, though it holds only its
share of the sequence. With it each rank encodes a share of the items and the features
are all-gathered where the sequence needs them. Items differ a lot in cost (Qwen2.5-VL's
native-resolution images: 4 to thousands of patches), so the share is balanced by each
item's vision work, as the CP token assignment balances blocks: LPT, a move/swap local
search, and with few items the branch-and-bound optimum (``cp_assignment.ours``).
An item is never split: no share beats the heaviest item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np

from ..errors import PlanError
from ..record import Record
from .cp_assignment import ours


@dataclass
class EncoderSplit(Record):
    """The CP rank encoding each item, in the items' order, and each rank's work."""

    owner: List[int] = field(default_factory=list)
    work: List[float] = field(default_factory=list)  # per rank

    @property
    def cp_size(self) -> int:
        return len(self.work)

    def items(self, rank: int) -> List[int]:
        """The items rank ``rank`` encodes, in their order in the micro-batch."""
        return [i for i, r in enumerate(self.owner) if r == rank]

    def imbalance(self) -> float:
        """max / mean of the ranks' work (1.0 = perfect)."""
        mean = sum(self.work) / len(self.work)
        return max(self.work) / mean if mean > 0 else 1.0


def split_items(work: Sequence[float], cp_size: int) -> EncoderSplit:
    """Items of vision work ``work`` (one number each, in the micro-batch's order) over
    ``cp_size`` ranks, the busiest rank's work as low as the search finds."""
    if cp_size < 1:
        raise PlanError("--context-parallel-size must be >= 1")
    w = np.asarray(work, float)
    if (w < 0).any():
        raise PlanError(f"item vision work must be >= 0, got {list(work)}")
    owner = ours(w, cp_size) if len(w) else np.zeros(0, np.int64)
    return EncoderSplit([int(r) for r in owner],
                        [float(w[owner == r].sum()) for r in range(cp_size)])

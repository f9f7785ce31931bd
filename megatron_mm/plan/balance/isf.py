"""OmniBal's ISF (iterative sampling and filtering): packed groups under two bounds.

Samples are packed greedily, in a random order, into groups whose total vision tiles stay
<= Q_v and total tokens <= Q_t. Groups that are full enough (tiles >= Q'_v or tokens >=
Q'_t) are final; the samples of the others go back to the pool, which is reshuffled and
packed again, T times in all; the last round's groups are accepted as they are. Every
sample that fits the bounds ends in exactly one group; samples over a bound on their own
are returned as ``oversize`` (OmniBal drops them silently).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from ..errors import PlanError
from .loads import SampleLoad


@dataclass(frozen=True)
class Bounds:
    max_vision: int  # Q_v: tiles per group
    max_tokens: int  # Q_t: tokens per group (the packed sequence length)
    min_vision: Optional[int] = None  # Q'_v: "full enough" on tiles (default Q_v)
    min_tokens: Optional[int] = None  # Q'_t: "full enough" on tokens (default Q_t - 128)

    def __post_init__(self):
        if self.max_vision < 1 or self.max_tokens < 1:
            raise PlanError(f"balance bounds must be positive, got {self.max_vision} tiles, "
                            f"{self.max_tokens} tokens")

    @property
    def full_vision(self) -> int:
        return self.max_vision if self.min_vision is None else self.min_vision

    @property
    def full_tokens(self) -> int:
        return self.max_tokens - 128 if self.min_tokens is None else self.min_tokens

    def fits(self, load: SampleLoad) -> bool:
        return load.vision <= self.max_vision and load.tokens <= self.max_tokens

    def __str__(self) -> str:
        return (f"{self.max_vision} tiles / {self.max_tokens} tokens "
                f"(full at {self.full_vision} / {self.full_tokens})")


@dataclass
class Grouping:
    groups: List[List[int]]
    oversize: List[int] = field(default_factory=list)  # samples over a bound on their own


def random_groups(ids: Sequence[int], loads: Sequence[SampleLoad], bounds: Bounds,
                  rng: random.Random) -> List[List[int]]:
    """Shuffle ``ids`` and pack them in that order, opening a group when one would overflow."""
    order = list(ids)
    rng.shuffle(order)
    groups, cur, sv, st = [], [], 0, 0
    qv, qt = bounds.max_vision, bounds.max_tokens
    for i in order:
        v, t = loads[i]
        if cur and (sv + v > qv or st + t > qt):
            groups.append(cur)
            cur, sv, st = [], 0, 0
        cur.append(i)
        sv += v
        st += t
    if cur:
        groups.append(cur)
    return groups


def isf(ids: Sequence[int], loads: Sequence[SampleLoad], bounds: Bounds, iterations: int,
        rng: random.Random) -> Grouping:
    """ISF over the samples ``ids``; ``iterations`` is OmniBal's T (>= 1)."""
    if iterations < 1:
        raise PlanError(f"ISF needs at least one iteration, got {iterations}")
    fitting = [i for i in ids if bounds.fits(loads[i])]
    oversize = [i for i in ids if not bounds.fits(loads[i])]
    groups = random_groups(fitting, loads, bounds, rng)
    final: List[List[int]] = []
    for _ in range(iterations - 1):
        pool: List[int] = []
        for g in groups:
            if (sum(loads[i].vision for i in g) >= bounds.full_vision
                    or sum(loads[i].tokens for i in g) >= bounds.full_tokens):
                final.append(g)
            else:
                pool += g
        if not pool:
            return Grouping(final, oversize)
        groups = random_groups(pool, loads, bounds, rng)
    return Grouping(final + groups, oversize)

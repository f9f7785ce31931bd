"""Exact min-max split of a sequence into contiguous, non-empty groups.

F(l, 1) = cost(0, l, 0); F(l, m) = min over j < l of max(F(j, m-1), cost(j, l, m-1)), where
cost(i, j, s) is the cost of items [i, j) as group s (the group index lets a cost depend on
the stage, as memory does through the micro-batches a stage keeps in flight). A feasibility
test excludes groups (a per-stage memory limit). Costs must not decrease when a group grows,
which lets the inner loop stop early; O(groups x n^2) in the worst case.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

SegmentCost = Callable[[int, int, int], float]  # (start, end, group) -> cost of [start, end)


def prefix_sums(values: Sequence[float]) -> List[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def minmax_split(n: int, groups: int, cost: SegmentCost,
                 feasible: Optional[Callable[[int, int, int], bool]] = None
                 ) -> Tuple[float, Optional[List[int]]]:
    """(best max cost, group sizes); (inf, None) when no split is feasible.

    Among optimal splits the last group is as large as the optimum allows, then the one
    before it, and so on: in 1F1B that puts layers where fewer micro-batches are in flight.
    """
    if groups < 1 or n < groups:
        return math.inf, None
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(groups)]
    cut = [[-1] * (n + 1) for _ in range(groups)]
    for end in range(1, n - groups + 2):
        if feasible is None or feasible(0, end, 0):
            best[0][end] = cost(0, end, 0)
    for g in range(1, groups):
        for end in range(g + 1, n - groups + g + 2):
            here, arg = inf, -1
            for start in range(end - 1, g - 1, -1):  # last group is [start, end)
                if feasible is not None and not feasible(start, end, g):
                    break  # growing the group further only adds memory
                seg = cost(start, end, g)
                if seg > here:
                    break  # ... and only adds cost
                value = max(best[g - 1][start], seg)
                if value <= here and value < inf:
                    here, arg = value, start
            best[g][end], cut[g][end] = here, arg
    if best[groups - 1][n] == inf:
        return inf, None
    sizes, end = [], n
    for g in range(groups - 1, 0, -1):
        start = cut[g][end]
        sizes.append(end - start)
        end = start
    sizes.append(end)
    return best[groups - 1][n], sizes[::-1]

"""How many micro-batches each pipeline stage keeps in flight (activations not yet freed).

1F1B: stage s runs PP - s - 1 warm-up forwards and one more before its first backward, so it
holds min(M, PP - s) micro-batches. Interleaved 1F1B (Megatron-Core): rank r runs
2 (PP - r - 1) + (VPP - 1) PP warm-up forwards over its chunks, walking them in groups of PP
micro-batches per chunk (chunk (k // PP) % VPP for the k-th forward); the peak is at the
end of the warm-up plus one forward. Counts are per local chunk of the rank.
"""

from __future__ import annotations

from typing import List, Optional


def inflight_microbatches(pp: int, vpp: int, rank: int,
                          num_microbatches: Optional[int] = None) -> List[int]:
    """Micro-batches in flight on ``rank``, per local chunk v (chunk v * PP + rank)."""
    if vpp == 1:
        held = pp - rank
        return [held if num_microbatches is None else min(num_microbatches, held)]
    forwards = 2 * (pp - rank - 1) + (vpp - 1) * pp + 1
    if num_microbatches is not None:
        forwards = min(forwards, num_microbatches * vpp)
    counts = [0] * vpp
    for k in range(forwards):
        counts[(k // pp) % vpp] += 1
    return counts

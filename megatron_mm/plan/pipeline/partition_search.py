"""OmniBal's partition search (BMP): anchor, neighbours within +-r layers, ranked.

The anchor cuts the chain greedily where the running per-layer time reaches k x total / N
(N = PP x VPP chunks). Candidates are every partition whose N - 1 boundaries each lie
within +-r layers of the anchor's (up to (2r + 1)^(N-1)), every chunk non-empty. Each is
ranked by the variance of the per-rank times (balance) and by the bytes crossing its
chunk boundaries (vision and LLM boundaries send very different activations); the rank
is the sum of the two orders, so a candidate good on both comes first. The runtime times
the top few for a few real iterations and keeps the fastest (``measured_s``).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..costs.hardware import Hardware, Interconnect
from ..costs.unit_costs import TimeModel
from ..errors import PlanError
from ..record import Record
from .layers import Layer
from .minmax import prefix_sums

# Beyond this many candidates the enumeration is the cost, not the timing: refuse early.
MAX_CANDIDATES = 200_000


@dataclass
class PartitionCandidate(Record):
    layers_per_chunk: List[int]
    rank_times: List[float]  # summed layer time of each pipeline rank's chunks
    variance: float  # population variance of rank_times
    boundary_bytes: float  # activation bytes sent across all chunk boundaries
    measured_s: Optional[float] = None  # max over ranks of the median iteration, when timed


def layer_times(chain: Sequence[Layer], hardware: Optional[Hardware] = None) -> List[float]:
    """Forward + backward per layer (recompute included): seconds with a measured
    profile applied (``apply_profile``; ``hardware`` its ``MEASURED``), FLOPs from the cost
    model otherwise; an MoE layer's expert all-to-alls (``Interconnect``'s default links)
    added in the same units, at ``hardware``'s speed (default: ``Hardware()``'s)."""
    hardware = hardware or Hardware()
    time, rate = TimeModel(hardware, Interconnect()), hardware.peak_flops * hardware.efficiency
    return [l.total_flops + (sum(time.expert_all_to_all_s([l])) * rate if l.a2a_bytes else 0.0)
            for l in chain]


def anchor_partition(times: Sequence[float], chunks: int) -> List[int]:
    """Greedy cut when the running sum reaches k x total / chunks; every chunk non-empty."""
    n = len(times)
    if n < chunks:
        raise PlanError(f"the chain has {n} layers, fewer than {chunks} pipeline stages")
    total, ends, running = sum(times), [], 0.0
    for i, t in enumerate(times):
        running += t
        k = len(ends) + 1
        if k == chunks:
            break
        # cut here if the target is reached, or if later chunks would run out of layers
        if running >= k * total / chunks or n - (i + 1) == chunks - k:
            ends.append(i + 1)
    ends.append(n)
    return [b - a for a, b in zip([0] + ends[:-1], ends)]


def score(chain: Sequence[Layer], counts: Sequence[int], pp: int,
          times: Optional[Sequence[float]] = None) -> PartitionCandidate:
    times = layer_times(chain) if times is None else times
    cum = prefix_sums(times)
    ranks = [0.0] * pp
    start, sent = 0, 0.0
    for c, n in enumerate(counts):
        ranks[c % pp] += cum[start + n] - cum[start]
        start += n
        if c < len(counts) - 1:
            sent += chain[start - 1].out_bytes + chain[start - 1].deepstack_bytes
    return PartitionCandidate(list(counts), ranks, statistics.pvariance(ranks), sent)


def candidates(chain: Sequence[Layer], pp: int, vpp: int = 1, radius: int = 1,
               times: Optional[Sequence[float]] = None,
               hardware: Optional[Hardware] = None) -> List[PartitionCandidate]:
    """Every partition with boundaries within +-``radius`` of the anchor's, best first
    (``times``: default ``layer_times(chain, hardware)``)."""
    if radius < 0:
        raise PlanError(f"--pipeline-search-radius must be >= 0, got {radius}")
    times = layer_times(chain, hardware) if times is None else list(times)
    chunks, n = pp * vpp, len(chain)
    anchor = anchor_partition(times, chunks)
    bounds = [int(b) for b in prefix_sums(anchor)[1:-1]]
    if (2 * radius + 1) ** len(bounds) > MAX_CANDIDATES:
        raise PlanError(f"--pipeline-search-radius {radius} over {chunks} stages gives "
                        f"{(2 * radius + 1) ** len(bounds)} candidates; lower the radius")
    found = []
    for shifts in itertools.product(range(-radius, radius + 1), repeat=len(bounds)):
        cuts = [0] + [b + s for b, s in zip(bounds, shifts)] + [n]
        if all(a < b for a, b in zip(cuts, cuts[1:])):
            found.append(score(chain, [b - a for a, b in zip(cuts, cuts[1:])], pp, times))
    return rank(found)


def rank(found: Sequence[PartitionCandidate]) -> List[PartitionCandidate]:
    """Sum of the candidate's place by variance and by boundary bytes (equal values share
    a place); ties by variance."""
    def places(key):
        values = sorted({key(c) for c in found})
        return {v: i for i, v in enumerate(values)}

    var, sent = places(lambda c: c.variance), places(lambda c: c.boundary_bytes)
    return sorted(found, key=lambda c: (var[c.variance] + sent[c.boundary_bytes],
                                        c.variance, c.layers_per_chunk))


def fastest(timed: Sequence[PartitionCandidate]) -> PartitionCandidate:
    measured = [c for c in timed if c.measured_s is not None]
    if not measured:
        raise PlanError("no partition candidate was timed")
    return min(measured, key=lambda c: c.measured_s)


def table(found: Sequence[PartitionCandidate], source: str) -> str:
    """The candidates as a printable table; ``source`` says where layer times came from."""
    lines = [f"> pipeline partition search (layer times: {source})",
             f"   {'partition':<24} {'rank-time variance':>19} {'boundary MB':>12} "
             f"{'measured s/iter':>16}"]
    for c in found:
        m = f"{c.measured_s:.4f}" if c.measured_s is not None else "-"
        lines.append(f"   {','.join(map(str, c.layers_per_chunk)):<24} {c.variance:>19.4g} "
                     f"{c.boundary_bytes / 1e6:>12.3f} {m:>16}")
    return "\n".join(lines)

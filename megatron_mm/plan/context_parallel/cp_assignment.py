"""Context-parallel token assignment: which tokens each CP rank holds (Cornstarch).

The sequence is cut into blocks of ``block`` tokens. A block's load is the attention
tiles (``block`` x ``block``) its queries really compute under the mask, plus a fixed cost
per block in the attention kernel (``block_overhead`` tiles, see ``BLOCK_OVERHEAD``), plus a
linear-layer term per token (``linear_weight`` tiles per full block). Methods:

- ``contiguous``: P runs of consecutive blocks (no balancing at all);
- ``zigzag``: 2P runs, rank r takes runs r and 2P-1-r (Megatron-Core's causal split);
- ``lpt``: heaviest block first to the least-loaded rank (Graham: within 4/3 of optimal);
- ``ours``: LPT, then a local search that moves or swaps blocks between the most-loaded
  rank and any other while that lowers the larger of the two loads; with few blocks
  (<= ``EXACT_MAX_BLOCKS``, where one block is a large share of a rank and both
  heuristics can be far off) a branch-and-bound search for the optimum, from there.

Ranks end up with different token counts; each rank's tokens are sorted, and their
positions stay global (RoPE and the mask are evaluated at global positions). A micro-batch
of several rows shares one assignment (the loads sum over rows). A sequence with fewer
blocks than ranks is not split: every rank holds every token (``replicated``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import List

import numpy as np

from ..errors import PlanError
from ..record import Record
from .attention_mask import tile_map

METHODS = ("contiguous", "zigzag", "lpt", "ours")
EXACT_MAX_BLOCKS = 32
EXACT_NODE_LIMIT = 5_000  # runs per micro-batch: keeps its best so far when it runs out

# Fixed cost of one query block in ``ContextParallelAttention`` (mask evaluation, softmax
# and einsum launches, and the backward of its key slice, which writes a gradient of the
# whole sequence), in attention tiles. Calibrated with ``python tools/bench_cp_attention.py
# --calibrate --iters 40`` on this project's 2-core CPU machine (1 thread, S=4096, block
# 128, 4 heads of 32, fp32): forward + backward of one query block against 1 .. 16 causal
# key tiles, least-squares fit ms = a * tiles + b, overhead = b / a; three runs gave 1.2,
# 1.4 and 1.5 tiles (load average 1.5). Per-tile time also grows with the key interval
# (cache), which this linear model does not capture. Re-measure on other hardware (a GPU
# kernel's fixed cost differs) and pass it as --context-parallel-block-overhead.
BLOCK_OVERHEAD = 1.4


@dataclass
class CPAssignment(Record):
    """Each CP rank's token indices (sorted, global) and its planned load."""

    method: str
    block: int
    seq_length: int
    tokens: List[List[int]] = field(default_factory=list)
    attention: List[float] = field(default_factory=list)  # tiles per rank
    load: List[float] = field(default_factory=list)  # attention + overhead + linear term
    replicated: bool = False
    blocks: List[int] = field(default_factory=list)  # query blocks per rank
    block_overhead: float = 0.0  # tiles per block (BLOCK_OVERHEAD)

    @property
    def cp_size(self) -> int:
        return len(self.tokens)

    @property
    def cost(self) -> List[float]:
        """Modelled attention time per rank, in tiles: tiles + block_overhead per block."""
        return [t + self.block_overhead * n for t, n in zip(self.attention, self.blocks)]

    def imbalance(self, what: str = "attention") -> float:
        """max / mean over ranks of ``attention`` (tiles), ``cost`` (tiles + per-block
        overhead: the attention time the kernel takes) or ``load`` (1.0 = perfect)."""
        values = np.asarray(getattr(self, what), float)
        return float(values.max() / values.mean()) if values.mean() > 0 else 1.0


def block_loads(codes: np.ndarray, block: int, linear_weight: float = 1.0,
                block_overhead: float = BLOCK_OVERHEAD):
    """(attention tiles, total load) per block, summed over the rows of [B, S] codes.
    The overhead counts once per block: the kernel runs one block of every row at once."""
    codes = np.atleast_2d(np.asarray(codes, np.int64))
    tiles = tile_map(codes, block).sum(axis=(0, 2)).astype(float)
    s = codes.shape[1]
    sizes = np.minimum(block, s - block * np.arange(len(tiles)))
    linear = linear_weight * codes.shape[0] * sizes / block
    return tiles, tiles + block_overhead + linear


def assign_tokens(codes: np.ndarray, cp_size: int, method: str = "ours", block: int = 128,
                  linear_weight: float = 1.0,
                  block_overhead: float = BLOCK_OVERHEAD) -> CPAssignment:
    """Each rank's token indices and load for mask ``codes`` ([S] or [B, S]) on
    ``cp_size`` ranks."""
    if method not in METHODS:
        raise PlanError(f"--context-parallel-assignment must be one of {METHODS}, "
                        f"got {method!r}")
    if cp_size < 1 or block < 1:
        raise PlanError("--context-parallel-size and --context-parallel-block must be >= 1")
    if block_overhead < 0:
        raise PlanError("--context-parallel-block-overhead must be >= 0")
    codes = np.atleast_2d(np.asarray(codes, np.int64))
    s = codes.shape[1]
    tiles, load = block_loads(codes, block, linear_weight, block_overhead)
    nb = len(tiles)
    if nb < cp_size or cp_size == 1:
        everything = list(range(s))
        return CPAssignment(method, block, s, [everything] * cp_size,
                            [float(tiles.sum())] * cp_size, [float(load.sum())] * cp_size,
                            replicated=cp_size > 1, blocks=[nb] * cp_size,
                            block_overhead=float(block_overhead))
    owner = _OWNERS[method](load, cp_size)
    tokens = []
    for r in range(cp_size):
        blocks = np.flatnonzero(owner == r)
        idx = (blocks[:, None] * block + np.arange(block)[None, :]).reshape(-1)
        tokens.append([int(i) for i in idx if i < s])
    per_rank = lambda w: [float(w[owner == r].sum()) for r in range(cp_size)]  # noqa: E731
    return CPAssignment(method, block, s, tokens, per_rank(tiles), per_rank(load),
                        blocks=[int((owner == r).sum()) for r in range(cp_size)],
                        block_overhead=float(block_overhead))


def contiguous(load: np.ndarray, p: int) -> np.ndarray:
    return _runs_owner(len(load), p, list(range(p)))


def zigzag(load: np.ndarray, p: int) -> np.ndarray:
    if len(load) < 2 * p:
        return contiguous(load, p)
    return _runs_owner(len(load), 2 * p, list(range(p)) + list(reversed(range(p))))


def lpt(load: np.ndarray, p: int) -> np.ndarray:
    """Longest processing time first; ties broken by block index, then rank index."""
    owner = np.empty(len(load), np.int64)
    heap = [(0.0, r) for r in range(p)]
    for b in sorted(range(len(load)), key=lambda i: (-load[i], i)):
        total, r = heapq.heappop(heap)
        owner[b] = r
        heapq.heappush(heap, (total + float(load[b]), r))
    return owner


def refine(load: np.ndarray, owner: np.ndarray, p: int, max_rounds: int = 10000) -> np.ndarray:
    """Local search on the makespan: move one block off the most-loaded rank, or swap one
    of its blocks with a lighter one elsewhere, taking the change that leaves the pair's
    larger load smallest, until none lowers it below the current maximum."""
    owner = owner.copy()
    totals = np.array([load[owner == r].sum() for r in range(p)])
    for _ in range(max_rounds):
        a = int(np.argmax(totals))
        top = totals[a]
        mine = np.flatnonzero(owner == a)
        others = np.flatnonzero(owner != a)
        best, move = top, None
        # Moves: block i of rank a to rank r.
        for r in range(p):
            if r == a:
                continue
            pair = np.maximum(top - load[mine], totals[r] + load[mine])
            i = int(np.argmin(pair))
            if pair[i] < best - 1e-9:
                best, move = pair[i], (mine[i], None, r)
        # Swaps: block i of rank a with block j of another rank.
        if len(others):
            wi, wj = load[mine][:, None], load[others][None, :]
            rj = owner[others][None, :]
            pair = np.maximum(top - wi + wj, totals[rj] - wj + wi)
            k = int(np.argmin(pair))
            if pair.flat[k] < best - 1e-9:
                i, j = divmod(k, len(others))
                best, move = pair.flat[k], (mine[i], others[j], int(owner[others[j]]))
        if move is None:
            break
        i, j, r = move
        owner[i] = r
        totals[a] -= load[i]
        totals[r] += load[i]
        if j is not None:
            owner[j] = a
            totals[r] -= load[j]
            totals[a] += load[j]
    return owner


def exact(load: np.ndarray, owner: np.ndarray, p: int,
          node_limit: int = EXACT_NODE_LIMIT) -> np.ndarray:
    """Branch and bound on the makespan from the incumbent ``owner``: blocks heaviest
    first, each to a rank (ranks of equal load tried once); a branch is cut when its
    current maximum or the perfect split of what is left cannot beat the incumbent."""
    order = sorted(range(len(load)), key=lambda i: (-load[i], i))
    w = [float(load[i]) for i in order]
    rest = np.concatenate([np.cumsum(w[::-1])[::-1], [0.0]])
    best = [max(load[owner == r].sum() for r in range(p)), owner.copy()]
    totals, chosen, nodes = [0.0] * p, [0] * len(w), [0]

    def search(k: int, top: float) -> None:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return
        if k == len(w):
            if top < best[0] - 1e-9:
                best[0] = top
                best[1] = np.empty(len(load), np.int64)
                best[1][order] = chosen
            return
        if max(top, (sum(totals) + rest[k]) / p) >= best[0] - 1e-9:
            return
        tried = set()
        for r in sorted(range(p), key=lambda r: totals[r]):
            if totals[r] in tried or totals[r] + w[k] >= best[0] - 1e-9:
                continue
            tried.add(totals[r])
            totals[r] += w[k]
            chosen[k] = r
            search(k + 1, max(top, totals[r]))
            totals[r] -= w[k]

    search(0, 0.0)
    return best[1]


def ours(load: np.ndarray, p: int) -> np.ndarray:
    owner = refine(load, lpt(load, p), p)
    return exact(load, owner, p) if len(load) <= EXACT_MAX_BLOCKS else owner


def _runs_owner(n: int, runs: int, owners: List[int]) -> np.ndarray:
    owner = np.empty(n, np.int64)
    for run, idx in enumerate(np.array_split(np.arange(n), runs)):
        owner[idx] = owners[run]
    return owner


_OWNERS = {"contiguous": contiguous, "zigzag": zigzag, "lpt": lpt, "ours": ours}

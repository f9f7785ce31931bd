"""Search the ISF bounds (Q_v, Q_t) for one dataset.

Bounds tuned for one data mix make balance worse on another (OmniBal's 9 tiles / 4096
tokens give 1.6 samples per group and imbalances of 0.28 / 0.31 on the four-file mix where
searched bounds give 0.003 / 0.07), so they are searched per dataset: walk Q_v along the ray
Q_t = Q_v * r (r: mean tokens per tile, rounded to 16), from about target x mean tiles up until
groups hold more than target + 1 samples and down until they hold fewer than the target, then try
Q_t +- r/2 at the best point; Q'_v = Q_v, Q'_t = Q_t - 128. The winner has the smallest padding +
vision imbalance + LLM imbalance among candidates whose mean samples per group lies in
[target, target + 1] (OmniBal's window); if none does (small data), the one closest to
the target. Q_v never goes below the largest sample's tiles, nor Q_t below its tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from ..errors import PlanError
from .isf import Bounds, isf
from .loads import SampleLoad
from .metrics import BalanceMetrics, measure
from .rounds import ROUNDS


@dataclass
class Candidate:
    bounds: Bounds
    metrics: BalanceMetrics

    @property
    def score(self) -> float:
        m = self.metrics
        return m.padding + m.vision_imbalance + m.llm_imbalance


def evaluate(loads: Sequence[SampleLoad], bounds: Bounds, dp: int, method: str,
             iterations: int, seed: int,
             llm_work: Optional[Callable[[int], float]] = None) -> BalanceMetrics:
    rng = random.Random(f"{seed}:search")
    grouping = isf(range(len(loads)), loads, bounds, iterations, rng)
    rounds = ROUNDS[method](grouping.groups, loads, dp, rng)
    if not rounds:
        raise PlanError(f"{bounds}: fewer packed groups than data-parallel ranks ({dp})")
    return measure(rounds, loads, packed=True, llm_work=llm_work)


def search_bounds(loads: Sequence[SampleLoad], dp: int, samples_per_group: float,
                  method: str = "isf-sorted", iterations: int = 10, seed: int = 0,
                  max_tokens: Optional[int] = None,
                  llm_work: Optional[Callable[[int], float]] = None) -> Candidate:
    """The best bounds for ``loads`` at ``dp`` ranks and the target samples per group.
    ``max_tokens`` caps Q_t (the packed sequence length, e.g. --seq-length); ``llm_work``
    scores the LLM imbalance by the model's work (``llm_work.LLMWork``), not tokens."""
    if not loads:
        raise PlanError("no samples to balance")
    top_v = max(1, max(l.vision for l in loads))
    top_t = max(l.tokens for l in loads)
    if max_tokens is not None and top_t > max_tokens:
        raise PlanError(f"a sample has {top_t} tokens, more than the packed length cap "
                        f"{max_tokens} (--seq-length)")
    tiles = sum(l.vision for l in loads) or len(loads)
    r = max(16, round(sum(l.tokens for l in loads) / tiles / 16) * 16)
    tried = {}

    def run(q_v: int, q_t: int) -> Optional[Candidate]:
        q_t = max(q_t, top_t)
        if max_tokens is not None:
            q_t = min(q_t, max_tokens)
        if (q_v, q_t) not in tried:
            bounds = Bounds(q_v, q_t, q_v, q_t - min(128, q_t // 8))
            try:
                tried[q_v, q_t] = Candidate(bounds, evaluate(loads, bounds, dp, method,
                                                             iterations, seed, llm_work))
            except PlanError:  # fewer groups than ranks
                tried[q_v, q_t] = None
        return tried[q_v, q_t]

    def spg(c: Optional[Candidate]) -> float:
        return float("inf") if c is None else c.metrics.samples_per_microbatch

    # Along the ray: from the tile bound that should hold the target, up past target + 1
    # and down below the target (each group's tiles are about target * mean tiles).
    start = max(top_v, round(samples_per_group * tiles / len(loads)))
    q_v = start
    # (Past the token cap more tiles change little: stop one tile's tokens beyond it.)
    while (spg(run(q_v, q_v * r)) <= samples_per_group + 1 and q_v < 64 * start
           and (max_tokens is None or (q_v - 1) * r <= max_tokens)):
        q_v += 1
    q_v = start - 1
    while q_v >= top_v and spg(run(q_v, q_v * r)) >= samples_per_group:
        q_v -= 1
    # Around the best point of the ray: Q_t half a tile's tokens either way.
    ray = [c for c in tried.values() if c is not None]
    if not ray:
        raise PlanError(f"no bounds give at least {dp} packed groups: the data is too small "
                        f"for {dp} data-parallel ranks")
    best = _pick(ray, samples_per_group)
    q_v, q_t = best.bounds.max_vision, best.bounds.max_tokens
    for dq in (-r // 2, r // 2):
        run(q_v, q_t + dq)
    return _pick([c for c in tried.values() if c is not None], samples_per_group)


def _pick(candidates: List[Candidate], target: float) -> Candidate:
    window = [c for c in candidates
              if target <= c.metrics.samples_per_microbatch <= target + 1]
    if window:
        return min(window, key=lambda c: c.score)
    return min(candidates, key=lambda c: abs(c.metrics.samples_per_microbatch - target))


def parse_bounds(text: str) -> Optional[Bounds]:
    """``--data-balance-bounds``: "auto" (None: search) or "Q_v,Q_t[,Q'_v,Q'_t]"."""
    if text == "auto":
        return None
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (2, 4):
        raise PlanError(f"--data-balance-bounds {text!r}: expected auto or "
                        "Q_v,Q_t[,Q'_v,Q'_t] (integers: tiles, tokens)")
    return Bounds(*values)

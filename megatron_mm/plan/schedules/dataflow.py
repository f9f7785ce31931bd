"""A dataflow schedule: whenever a rank is free it runs the most urgent action whose inputs
are there, LLM and encoder work alike.

The bubble schedule of ``bubble.py`` keeps the LLM in Megatron-Core's 1F1B order and slips
encoder pieces into its idle time. That order is fixed before any encoder work is placed,
so the LLM's own warm-up and cool-down stay where 1F1B puts them. Here nothing is fixed but
the dependencies (``Schedule.dependencies``) and two memory bounds, and the order comes out
of a list-scheduling replay on the per-action costs:

- at every step the action that can start earliest on any rank runs (its inputs' arrival:
  the producer's end, plus ``costs.p2p_s`` from another rank; LLM actions also wait for the
  data-parallel all-gather, ``costs.llm_start_s``);
- among actions that could start at the same moment: LLM backward, LLM forward, encoder
  forward, encoder backward, then the lower micro-batch (what frees memory and feeds the
  LLM first; encoder backwards are the work with the most slack, so they fill what is left);
  ``longest_chain_first``: among encoder backwards, the one with the most encoder backward
  work still behind it (its micro-batch's pieces before it) first: the last micro-batch's
  backward, which passes from rank to rank piece by piece (an interleaved encoder's most of
  all), starts as soon as it can and the earlier micro-batches' pieces fill its waits;
- ``max_in_flight``: at most that many micro-batches between their first LLM forward
  ``F(m, 0)`` and the end of their ``B(m, 0)``: the LLM activations a rank holds, as in
  1F1B where the first rank holds PP of them;
- ``max_encoder_ahead``: at most that many micro-batches whose encoder work has started
  while their ``F(m, 0)`` has not.

With the encoder placed from the last rank (``reverse``) its forwards start where 1F1B's
warm-up leaves the last rank idle and its backwards end on the first rank, idle in 1F1B's
cool-down. ``bubble(..., extra_warmup="auto")`` tries this schedule next to its own and
keeps whichever simulates faster. The result is plain data (``actions.Schedule``), checked by
``validate`` and replayed by ``simulate`` like any other schedule.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from ..errors import PlanError
from .actions import Action, Kind, Schedule, validated
from .collectives import add_collectives
from .problem import ScheduleProblem
from .simulate import ActionCosts

Key = Tuple[str, int, int]
_URGENCY = {Kind.B: 0, Kind.F: 1, Kind.EF: 2, Kind.EB: 3}


@validated
def dataflow(problem: ScheduleProblem, max_in_flight: Optional[int] = None,
             max_encoder_ahead: Optional[int] = None,
             longest_chain_first: bool = False) -> Schedule:
    """The dataflow schedule for ``problem`` and its per-action costs (module docstring);
    the bounds default to PP micro-batches each."""
    costs = problem.costs_for("dataflow")
    schedule = problem.empty_schedule("dataflow")
    in_flight = max_in_flight or problem.pp
    ahead = max_encoder_ahead or problem.pp
    if in_flight < 1 or ahead < 1:
        raise PlanError(f"the dataflow schedule needs room for one micro-batch in flight "
                        f"(got max_in_flight={in_flight}, max_encoder_ahead={ahead})")
    schedule.ranks = _Order(schedule, costs, in_flight, ahead, longest_chain_first).run()
    return add_collectives(schedule, problem.encoder_replicas, problem.grad_sync,
                           problem.encoder_grad_sync)


class _Order:
    """The list scheduling that gives the order (module docstring)."""

    def __init__(self, schedule: Schedule, costs: ActionCosts, in_flight: int, ahead: int,
                 longest_chain_first: bool = False):
        self.s, self.costs, self.in_flight, self.ahead = schedule, costs, in_flight, ahead
        self.longest_chain_first = longest_chain_first
        m, n = schedule.num_microbatches, schedule.encoder_stages
        todo = [Action(Kind.F, mb, c) for mb in range(m) for c in range(schedule.num_chunks)]
        todo += [Action(Kind.B, mb, c) for mb in range(m) for c in range(schedule.num_chunks)]
        todo += [Action(Kind.EF, mb, p) for mb in range(m) for p in range(n)]
        todo += [Action(Kind.EB, mb, p) for mb in range(m) for p in range(n)
                 if schedule.encoder_backward(p)]
        self.total = len(todo)
        self.finish: Dict[Key, float] = {}
        self.rank: Dict[Key, int] = {}
        self.clock = [0.0] * schedule.pipeline_model_parallel_size
        self.orders: List[List[Action]] = [[] for _ in self.clock]
        # actions whose inputs are all scheduled, per rank; the rest wait for a count
        self.ready: List[List[Action]] = [[] for _ in self.clock]
        self.waiting: Dict[Key, int] = {}
        self.successors: Dict[Key, List[Action]] = {}
        for a in todo:
            deps = schedule.dependencies(a)
            self.waiting[a.key] = len(deps)
            for d in deps:
                self.successors.setdefault(d, []).append(a)
            if not deps:
                self.ready[schedule.rank_of(a)].append(a)
        self.firsts = [first for first, _ in schedule.encoder_spans()]
        self.encoder_started: Set[int] = set()  # micro-batches
        self.llm_started: Set[int] = set()
        self.llm_done: Set[int] = set()  # B(m, 0) scheduled

    def cost(self, a: Action) -> float:
        return self.costs.of(a.kind, a.chunk, a.microbatch)

    def chain(self, a: Action) -> float:
        """With ``longest_chain_first``, an encoder backward's work still to follow in its
        micro-batch (its own and its encoder's earlier pieces'); else 0."""
        if not (self.longest_chain_first and a.kind == Kind.EB):
            return 0.0
        first, _ = self.s.encoder_span(a.chunk)
        return sum(self.costs.of(Kind.EB, p, a.microbatch) for p in range(first, a.chunk + 1))

    def arrival(self, a: Action, rank: int) -> float:
        t = self.costs.llm_start_s if a.kind.llm else 0.0
        for d in self.s.dependencies(a):
            t = max(t, self.finish[d] + (self.costs.p2p_s if self.rank[d] != rank else 0.0))
        return t

    def allowed(self, a: Action) -> bool:
        """Whether ``a`` starts within the memory bounds."""
        mb = a.microbatch
        if a.kind == Kind.F and a.chunk == 0 and mb not in self.llm_started:
            return len(self.llm_started - self.llm_done) < self.in_flight
        if a.kind == Kind.EF and a.chunk in self.firsts and mb not in self.encoder_started:
            return len(self.encoder_started - self.llm_started) < self.ahead
        return True

    def run(self) -> List[List[Action]]:
        done = 0
        while done < self.total:
            best = None
            for r, ready in enumerate(self.ready):
                for a in ready:
                    if not self.allowed(a):
                        continue
                    key = (max(self.clock[r], self.arrival(a, r)), _URGENCY[a.kind],
                           -self.chain(a), a.microbatch, r)
                    if best is None or key < best[0]:
                        best = (key, a)
            if best is None:
                raise PlanError("the dataflow schedule is stuck: no ready action fits the "
                                "memory bounds (max_in_flight / max_encoder_ahead)")
            (start, _, _, mb, r), a = best
            self.commit(a, r, start)
            done += 1
        return self.orders

    def commit(self, a: Action, r: int, start: float) -> None:
        self.ready[r].remove(a)
        self.finish[a.key], self.rank[a.key] = start + self.cost(a), r
        self.clock[r] = self.finish[a.key]
        self.orders[r].append(a)
        if a.kind == Kind.F and a.chunk == 0:
            self.llm_started.add(a.microbatch)
        elif a.kind == Kind.B and a.chunk == 0:
            self.llm_done.add(a.microbatch)
        elif a.kind == Kind.EF and a.chunk in self.firsts:
            self.encoder_started.add(a.microbatch)
        for b in self.successors.get(a.key, ()):
            self.waiting[b.key] -= 1
            if not self.waiting[b.key]:
                self.ready[self.s.rank_of(b)].append(b)

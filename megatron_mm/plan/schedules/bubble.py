"""Optimus' ``bubble`` schedule: encoder work moved into the LLM pipeline's idle time.

The LLM keeps Megatron-Core's order on every rank (``generate.llm_order``). The encoder runs
as its own pipeline (``encoder_stages`` stages, each cut into ``pieces`` consecutive pieces
on the same rank, so that work fits into short bubbles; with several encoders, vision and
audio say, each is such a pipeline and ``F(m, 0)`` waits for all of them), and its actions
are placed by list scheduling on the per-action costs:

- a rank runs its next LLM action when its inputs are there, unless an encoder action that
  is ready ends before that LLM action could start (it fills the bubble);
- while its next LLM action waits for another rank, the rank runs encoder work that ends
  before the earliest that input can arrive (estimated from the producer rank's clock and
  the LLM work queued in front of it), or that the LLM action needs itself;
- encoder forwards go in micro-batch order (the i-th encoder output feeds LLM micro-batch
  i); encoder backwards wait for the gradient of the merged embeddings (``B(m, 0)``). A
  frozen encoder schedules forwards only;
- LLM actions wait for the data-parallel all-gather (``costs.llm_start_s``), so encoder
  work fills that bubble too;
- ``tp_bubbles``: while an LLM action waits for its tensor-parallel all-reduces
  (``costs.forward_comm_s`` / ``backward_comm_s``), the rank runs encoder actions whose
  inputs are there when it starts and that fit in what is left of that wait (Optimus'
  TP-bubble filling; small pieces, e.g. attention / MLP kernels, fit best); their own TP
  all-reduces (``costs.encoder_*_comm_s``) slow the LLM's on the same links, so they
  lengthen the rank's time too;
- ``extra_warmup="quick"``: Megatron-Core's order and one dataflow order only, the faster
  (to rank many candidate plans before the full search on the best);
- ``extra_warmup="auto"`` also tries one and two more LLM warm-up forwards per rank
  (Optimus' adjusted warm-up: the backwards come later, which can open room for encoder
  work, at the cost of activations in flight), and the ``dataflow`` schedule (no fixed LLM
  order: every rank runs the most urgent ready action, with PP, PP + 1, PP + 2 or PP x VPP
  micro-batches in flight and PP or 2 PP micro-batches' encoder work ahead of the LLM;
  for an interleaved encoder each also ``longest_chain_first``),
  and keeps the fastest by simulation.

The collectives (``collectives.add_collectives``) are placed once the compute is ordered.
The result is plain data (``actions.Schedule``), checked by ``validate`` and replayed by
``simulate`` like any other schedule.
"""

from __future__ import annotations

import heapq
from itertools import accumulate
from typing import Dict, List, Optional, Tuple, Union

from ..errors import PlanError
from .actions import Action, Kind, Schedule, validated
from .collectives import add_collectives
from .dataflow import dataflow
from .generate import llm_order
from .problem import ScheduleProblem
from .simulate import ActionCosts, simulate

Key = Tuple[str, int, int]


@validated
def bubble(problem: ScheduleProblem, extra_warmup: Union[int, str] = 0,
           tp_bubbles: bool = False) -> Schedule:
    """The bubble-filling schedule for ``problem`` and its per-action costs
    (``costs.encoder_*_s`` per encoder piece, the encoders' pieces one after the other)."""
    costs = problem.costs_for("bubble")
    pp, vpp = problem.pp, problem.vpp
    if extra_warmup == "quick":  # 1F1B's order and one dataflow order: to rank many plans
        return min([bubble(problem, 0, tp_bubbles),
                    dataflow(problem, max_in_flight=pp + 1, max_encoder_ahead=2 * pp,
                             longest_chain_first=True)],
                   key=lambda s: simulate(s, costs, timeline=False).iteration_s)
    if extra_warmup == "auto":
        options = [bubble(problem, extra, tp_bubbles) for extra in (0, 1, 2)]
        # longest chain first pays where a micro-batch's backward crosses ranks piece by
        # piece: an interleaved encoder
        interleaved = any(layout.virtual > 1 for layout in problem.layouts)
        chains = (False, True) if interleaved else (False,)
        if not tp_bubbles:  # the dataflow order within these memory bounds
            options += [dataflow(problem, max_in_flight=in_flight, max_encoder_ahead=ahead,
                                 longest_chain_first=chain)
                        for in_flight in sorted({pp, pp + 1, pp + 2, pp * vpp})
                        for ahead in (pp, 2 * pp) for chain in chains]
        return min(options, key=lambda s: simulate(s, costs, timeline=False).iteration_s)
    schedule = problem.empty_schedule("bubble")
    ranks_of_piece, n = schedule.encoder_ranks, schedule.encoder_stages
    if len(costs.encoder_forward_s) < n or (problem.encoder_trainable
                                            and len(costs.encoder_backward_s) < n):
        raise PlanError(f"the bubble schedule needs encoder costs for all {n} encoder pieces")
    m = problem.num_microbatches
    llm = [llm_order(pp, vpp, m, r, extra_warmup) for r in range(pp)]
    forwards = [[Action(Kind.EF, mb, s) for mb in range(m)
                 for s in range(n) if ranks_of_piece[s] == r] for r in range(pp)]
    backwards = [[Action(Kind.EB, mb, s) for mb in range(m)
                  for s in reversed(range(n))
                  if ranks_of_piece[s] == r and schedule.encoder_backward(s)]
                 for r in range(pp)]
    _ListScheduler(schedule, costs, llm, forwards, backwards, tp_bubbles).run()
    return add_collectives(schedule, problem.encoder_replicas, problem.grad_sync,
                           problem.encoder_grad_sync)


class _ListScheduler:
    def __init__(self, schedule: Schedule, costs: ActionCosts, llm: List[List[Action]],
                 forwards: List[List[Action]], backwards: List[List[Action]],
                 tp_bubbles: bool = False):
        self.s, self.costs, self.tp_bubbles = schedule, costs, tp_bubbles
        self.llm, self.forwards, self.backwards = llm, forwards, backwards
        pp = schedule.pipeline_model_parallel_size
        self.pos = [0] * pp
        self.clock = [0.0] * pp
        self.finish: Dict[Key, float] = {}
        self.owner: Dict[Key, int] = {}
        self.orders: List[List[Action]] = [[] for _ in range(pp)]
        self.llm_index = [{a.key: i for i, a in enumerate(order)} for order in llm]
        # LLM work queued on a rank between two positions, in O(1)
        self.prefix = [[0.0] + list(accumulate(self.cost(a) for a in order)) for order in llm]
        # encoder actions whose inputs are all scheduled, per rank and queue, by queue
        # position: the first ready one of a queue is a heap top, not a scan
        self.ready: List[List[List[Tuple[int, Action]]]] = [[[], []] for _ in range(pp)]
        self.waiting: Dict[Key, int] = {}
        self.successors: Dict[Key, List[Tuple[int, int, int, Action]]] = {}
        for r in range(pp):
            for q, queue in enumerate((forwards[r], backwards[r])):
                for i, a in enumerate(queue):
                    deps = schedule.dependencies(a)
                    self.waiting[a.key] = len(deps)
                    for d in deps:
                        self.successors.setdefault(d, []).append((r, q, i, a))
                    if not deps:
                        self.ready[r][q].append((i, a))
        for r in range(pp):
            for heap in self.ready[r]:
                heapq.heapify(heap)

    def cost(self, a: Action) -> float:
        return self.costs.of(a.kind, a.chunk)

    def arrival(self, a: Action, rank: int) -> Optional[float]:
        """When ``a``'s inputs are on ``rank``; None while one is not yet scheduled."""
        t = self.costs.llm_start_s if a.kind.llm else 0.0
        for d in self.s.dependencies(a):
            if d not in self.finish:
                return None
            t = max(t, self.finish[d] + (self.costs.p2p_s if self.owner[d] != rank else 0.0))
        return t

    def estimate(self, key: Key, rank: int, memo: Dict[Key, float]) -> float:
        """Earliest plausible arrival on ``rank`` of unscheduled ``key``: its producer's
        clock plus the LLM work queued before it there, after its own inputs."""
        if key in self.finish:
            return self.finish[key] + (self.costs.p2p_s if self.owner[key] != rank else 0.0)
        if key not in memo:
            a = Action(*key)
            q = self.s.rank_of(a)
            index = self.llm_index[q].get(key)
            queued = (self.prefix[q][index] - self.prefix[q][self.pos[q]]
                      if index is not None and index > self.pos[q] else 0.0)
            ready = max([self.estimate(d, q, memo) for d in self.s.dependencies(a)],
                        default=self.costs.llm_start_s if a.kind.llm else 0.0)
            memo[key] = max(self.clock[q] + queued, ready) + self.cost(a)
        return memo[key] + (self.costs.p2p_s if self.s.rank_of(Action(*key)) != rank else 0.0)

    def latest_start(self, a: Action) -> float:
        """For an encoder forward: the latest start that does not hold up ``F(m, 0)``, the
        LLM's first chunk, were rank 0 to run its queued LLM work back to back."""
        if a.kind != Kind.EF:
            return float("inf")
        first = (Kind.F, a.microbatch, 0)
        index = self.llm_index[0][first]
        queued = (self.prefix[0][index] - self.prefix[0][self.pos[0]]
                  if index > self.pos[0] else 0.0)
        rest = sum(self.costs.of(Kind.EF, s) + self.costs.p2p_s
                   for s in range(a.chunk + 1, self.s.encoder_span(a.chunk)[1]))
        return self.clock[0] + queued - rest - self.cost(a) - self.costs.p2p_s

    def ready_encoder(self, rank: int) -> Optional[Tuple[float, Action]]:
        """The first encoder action in queue order (forwards, then backwards) whose inputs
        are all scheduled, and when it could start."""
        for heap in self.ready[rank]:
            if heap:
                a = heap[0][1]
                return max(self.clock[rank], self.arrival(a, rank)), a
        return None

    def choice(self, rank: int) -> Optional[Tuple[float, Action, bool]]:
        """(start, action, forced) this rank would run next; None: it waits for others."""
        llm = self.llm[rank][self.pos[rank]] if self.pos[rank] < len(self.llm[rank]) else None
        enc = self.ready_encoder(rank)
        if llm is None:
            return None if enc is None else (enc[0], enc[1], False)
        t = self.arrival(llm, rank)
        if t is not None:
            start = max(self.clock[rank], t)
            if enc is not None and (enc[0] + self.cost(enc[1]) <= start + 1e-12
                                    or start + self.cost(llm) > self.latest_start(enc[1])):
                return enc[0], enc[1], False
            return start, llm, False
        if enc is None:
            return None
        needed = enc[1].kind == Kind.EF and enc[1].microbatch <= llm.microbatch
        deps = [self.estimate(d, rank, {}) for d in self.s.dependencies(llm)]
        fits = enc[0] + self.cost(enc[1]) <= max([self.clock[rank]] + deps) + 1e-12
        if needed or fits:
            return enc[0], enc[1], False
        return enc[0], enc[1], True  # only if no rank has anything better

    def run(self) -> None:
        total = sum(map(len, self.llm)) + sum(map(len, self.forwards)) + sum(
            map(len, self.backwards))
        while sum(map(len, self.orders)) < total:
            options = [(c[2], c[0], r, c[1]) for r in range(len(self.llm))
                       if (c := self.choice(r)) is not None]
            if not options:
                raise PlanError("the bubble schedule deadlocks: no rank can run its next "
                                "action (is an encoder piece's cost missing?)")
            _, start, rank, a = min(options, key=lambda o: (o[0], o[1], o[2]))
            self.commit(rank, a, start)
        self.s.ranks = self.orders

    def commit(self, rank: int, a: Action, start: float) -> None:
        end = start + self.cost(a)
        self.finish[a.key], self.owner[a.key] = end, rank
        self.clock[rank] = end
        self.orders[rank].append(a)
        if a.kind.llm:
            self.pos[rank] += 1
        else:
            heapq.heappop(self.ready[rank][0 if a.kind == Kind.EF else 1])
        self.release(a)
        if a.kind.llm and self.tp_bubbles:
            self.fill_tp_bubble(rank, start, self.costs.tp_bubble(a.kind, a.chunk))

    def release(self, a: Action) -> None:
        for r, q, i, b in self.successors.get(a.key, ()):
            self.waiting[b.key] -= 1
            if not self.waiting[b.key]:
                heapq.heappush(self.ready[r][q], (i, b))

    def fill_tp_bubble(self, rank: int, at: float, left: float) -> None:
        """Encoder actions inside the TP communication of the LLM action started at
        ``at``: the first ready one of each queue whose inputs are there by ``at`` and that
        fits in what is ``left``, as long as one does."""
        while left > 0:
            for q, heap in enumerate(self.ready[rank]):
                if heap:
                    a = heap[0][1]
                    arrival = self.arrival(a, rank)
                    cost = self.cost(a)
                    comm = self.costs.encoder_comm(a.kind, a.chunk)  # not hidden
                    if arrival is not None and arrival <= at + 1e-12 and cost <= left + 1e-12:
                        break
            else:
                return
            heapq.heappop(heap)
            self.finish[a.key], self.owner[a.key] = at + cost, rank
            self.clock[rank] += comm  # its all-reduces share the LLM's links
            self.orders[rank].append(Action(a.kind, a.microbatch, a.chunk, in_tp_bubble=True))
            self.release(a)
            at, left = at + cost, left - cost

"""Optimus' model planner: the encoder's own parallel plan and schedule inside the LLM's.

The LLM plan (PP, TP, DP, VPP) and the global batch are fixed. Enumerated:

- encoder plans: PP_enc dividing PP, TP_enc dividing TP, DP_enc = DP (PP / PP_enc)
  (TP / TP_enc), so every GPU holds encoder and LLM state; plans that do not fit in
  memory are rejected (``CostModel.memory_bytes``);
- micro-batch sizes (``micro_batch_sizes``): the number of micro-batches the fixed global
  batch is cut into;
- encoder pieces (granularity) and placement order (``generate.encoder_placement``:
  forward or ``reverse``, the encoder ending on the rank where the LLM starts); pieces
  of whole layers, and of attention / MLP kernels (``sublayer``, as Optimus cuts them)
  where a stage's layers do not split evenly into the pieces, or are fewer than them;
- schedules: ``coarse`` (Optimus' initial schedule) and ``bubble`` (fine-grained filling).

Each candidate's per-action costs come from the cost model (``action_costs``), its
schedule is simulated (``simulate``), and the fastest wins. The baseline is Megatron-LM
with the encoder inside LLM chunk 0 on the first stage (at ``baseline_vpp``, Megatron-LM's
plain 1F1B in Optimus' runs), and at the plan's VPP for a like-for-like comparison.

Pruning keeps it fast: an encoder plan's LLM-only iteration (the same costs, no encoder
work) bounds every schedule of that plan from below, so plans are tried in that order and
skipped once the bound is no better than the best found; ``bubble`` is not tried where
``coarse`` already hides all encoder work.

Several encoders (vision and audio): the first is enumerated as above; each other one
gets its own layout (stages, pieces, order; ``_other_layouts``), all at the same encoder
TP (one ``--encoder-tensor-model-parallel-size``).

An MoE LLM's expert all-to-alls are actions of every schedule simulated here (the
baseline's too: ``collectives.add_expert_all_to_alls`` on the chunks holding MoE layers),
charged by the cost model; the generators order the compute on costs with them folded in.

The bubble schedule also fills the LLM's TP bubbles (its layers' all-reduces) with small
encoder pieces (``bubble(tp_bubbles=True)``), as Optimus does at kernel level.

Not modelled (see ``action_costs``): encoder pipelines on disjoint rank
sets when PP_enc < PP (the IR has one encoder pipeline per LLM pipeline: PP_enc < PP puts
the encoder's stages on PP_enc of the ranks), and uneven micro-batch compositions among the
co-located encoder pipelines (identical pipelines: the even split is taken); nor the
encoder interleaved over its stages (``--encoder-virtual-pipeline-model-parallel-size``,
which the training run's ``auto`` tries): Optimus does not interleave its encoder, and the
figures this planner reproduces are Optimus'.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, List, Optional, Sequence

from ..costs.hardware import Hardware, Interconnect
from ..errors import PlanError
from ..model import ModelSpec
from ..record import Record
from .action_costs import CostModel, EncoderPlan, LLMLayout
from .actions import Schedule, validate
from .bubble import bubble
from .collectives import add_expert_all_to_alls
from .generate import EncoderLayout, ScheduleProblem, coarse, megatron
from .simulate import ActionCosts, simulate

GB = 1e9


@dataclass
class Candidate(Record):
    encoder_pipeline_model_parallel_size: int
    encoder_tensor_model_parallel_size: int
    encoder_data_parallel_size: int
    encoder_pieces: int
    reverse: bool
    schedule: str  # coarse | bubble
    micro_batch_size: int
    num_microbatches: int
    iteration_s: float
    llm_only_iteration_s: float
    encoder_hidden_fraction: float
    memory_gb: float
    sublayer: bool = False  # pieces cut at attention / MLP kernels, not whole layers
    # the layouts of the encoders after the first (a small audio encoder on fewer ranks)
    other_encoders: List[EncoderLayout] = field(default_factory=list)

    def describe(self) -> str:
        return (f"{self.schedule}, encoder PP {self.encoder_pipeline_model_parallel_size} "
                f"TP {self.encoder_tensor_model_parallel_size} DP "
                f"{self.encoder_data_parallel_size}, {self.encoder_pieces} "
                f"{'sub-layer ' if self.sublayer else ''}piece(s) per "
                f"stage{', reversed' if self.reverse else ''}, micro-batch "
                f"{self.micro_batch_size} x {self.num_microbatches}"
                + "".join(f"; encoder {e + 1}: PP {o.encoder_pipeline_model_parallel_size}, "
                          f"{o.pieces} piece(s){', reversed' if o.reverse else ''}"
                          for e, o in enumerate(self.other_encoders)))


@dataclass
class EncoderSchedulePlan(Record):
    model: str
    layout: LLMLayout  # the chosen micro-batch size
    gpus: int
    baseline_vpp: int
    baseline_iteration_s: float  # Megatron, encoder in chunk 0, VPP = baseline_vpp
    interleaved_baseline_iteration_s: float  # the same at the plan's VPP
    best: Candidate
    schedule: Schedule  # the chosen one, validated
    candidates: List[Candidate] = field(default_factory=list)  # fastest first
    rejected: List[str] = field(default_factory=list)  # plans that do not fit, and why
    pruned: int = 0  # encoder plans skipped by the LLM-only bound

    @property
    def iteration_s(self) -> float:
        return self.best.iteration_s

    @property
    def speedup(self) -> float:
        return self.baseline_iteration_s / self.best.iteration_s

    @property
    def speedup_interleaved(self) -> float:
        return self.interleaved_baseline_iteration_s / self.best.iteration_s

    @property
    def encoder_hidden_fraction(self) -> float:
        return self.best.encoder_hidden_fraction


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def granularities(layers: int, pp_enc: int, pieces: Sequence[int]) -> List[tuple]:
    """(pieces per stage, sublayer) to try: whole layers where the encoder has enough, and
    attention / MLP kernels where whole layers cannot cut a stage evenly into the pieces."""
    options = []
    for k in pieces:
        if pp_enc * k <= layers:
            options.append((k, False))
        if pp_enc * k <= 2 * layers and (pp_enc * k > layers or layers % (pp_enc * k)):
            options.append((k, True))
    return options


def _other_layouts(cm: CostModel, plan: EncoderPlan, num_microbatches: int,
                   settings: dict) -> List[EncoderLayout]:
    """Each encoder after the first its own layout (stages dividing PP, 1 or 2 pieces per
    stage, placement order), chosen one encoder after the other by the simulated bubble
    schedule, the first encoder at one piece per stage of ``plan``: a small encoder gets
    fewer ranks when that fills the bubbles better."""
    lay = cm.layout
    pp, vpp = lay.pipeline_model_parallel_size, lay.virtual_pipeline_model_parallel_size
    main = EncoderLayout(plan.encoder_pipeline_model_parallel_size)
    chosen = [main] * (len(cm.encoders) - 1)
    for e in range(1, len(cm.encoders)):
        layers = cm.encoders[e].spec.transformer.num_layers
        best = None
        for stages in _divisors(pp):
            for k in (1, 2):
                if stages * k > layers:
                    continue
                for reverse in (False, True):
                    trial = chosen[:e - 1] + [EncoderLayout(stages, k, reverse)] + chosen[e:]
                    costs = cm.optimus(plan, 1, others=trial).all_to_alls_folded()
                    s = bubble(ScheduleProblem(
                        pp, num_microbatches, virtual_pipeline_model_parallel_size=vpp,
                        encoder_trainable=cm.encoder_trainable, costs=costs,
                        layouts=[main] + trial, **settings))
                    t = simulate(s, costs, False).iteration_s
                    if best is None or t < best[0] - 1e-12:
                        best = (t, trial[e - 1])
        chosen[e - 1] = best[1]
    return chosen


def _llm_only(costs: ActionCosts) -> ActionCosts:
    return replace(costs, encoder_forward_s=[], encoder_backward_s=[], broadcast_s=[],
                   replica_allreduce_s=[], encoder_reduce_s=[])


def plan_encoder_schedule(model: ModelSpec, layout: LLMLayout, hardware: Hardware,
                          links: Interconnect, pieces: Sequence[int] = (1, 2, 4, 8),
                          schedules: Sequence[str] = ("coarse", "bubble"),
                          micro_batch_sizes: Optional[Iterable[int]] = None,
                          baseline_vpp: int = 1,
                          memory_limit_bytes: float = 0.9 * 80 * 1024 ** 3
                          ) -> EncoderSchedulePlan:
    pp, tp = layout.pipeline_model_parallel_size, layout.tensor_model_parallel_size
    vpp = layout.virtual_pipeline_model_parallel_size
    unknown = set(schedules) - {"coarse", "bubble"}
    if unknown:
        raise PlanError(f"unknown schedules {sorted(unknown)}; expected coarse or bubble")
    base_layout = replace(layout, virtual_pipeline_model_parallel_size=baseline_vpp)
    base = CostModel(model, base_layout, hardware, links)
    m = layout.num_microbatches
    full = CostModel(model, layout, hardware, links)
    baseline_s = simulate(add_expert_all_to_alls(megatron(pp, baseline_vpp, m, grad_sync=True),
                                                 base.expert_chunks()),
                          base.baseline(), False).iteration_s
    interleaved_s = simulate(add_expert_all_to_alls(megatron(pp, vpp, m, grad_sync=True),
                                                    full.expert_chunks()),
                             full.baseline(), False).iteration_s

    # every (micro-batch size, encoder plan) that fits, with its LLM-only lower bound
    options, rejected = [], []
    for mbs in sorted(set(micro_batch_sizes or [layout.micro_batch_size])):
        try:
            lay = replace(layout, micro_batch_size=mbs)
        except PlanError as e:
            rejected.append(f"micro-batch size {mbs}: {e}")
            continue
        cm = CostModel(model, lay, hardware, links)
        for pp_enc in _divisors(pp):
            for tp_enc in _divisors(tp):
                plan = EncoderPlan.of(lay, pp_enc, tp_enc)
                mem = cm.memory_bytes(plan)
                if mem > memory_limit_bytes:
                    rejected.append(f"encoder PP {pp_enc} TP {tp_enc}, micro-batch {mbs}: "
                                    f"{mem / GB:.1f} GB > {memory_limit_bytes / GB:.1f} GB")
                    continue
                bound = simulate(add_expert_all_to_alls(
                    megatron(pp, vpp, lay.num_microbatches, grad_sync=True),
                    cm.expert_chunks()), _llm_only(cm.optimus(plan, 1)), False).iteration_s
                options.append((bound, mbs, pp_enc, tp_enc, lay, cm, plan, mem))
    if not options:
        raise PlanError("no encoder plan fits in memory: " + "; ".join(rejected[:4]))
    options.sort(key=lambda o: o[:4])

    candidates: List[Candidate] = []
    schedules_of = {}
    best: Optional[Candidate] = None
    pruned = 0
    for bound, mbs, pp_enc, tp_enc, lay, cm, plan, mem in options:
        if best is not None and bound >= best.iteration_s - 1e-12:
            pruned += 1
            continue
        n = lay.num_microbatches
        # the encoders' own data-parallel groups: each piece reduces on its own
        settings = dict(encoder_replicas=tp // tp_enc, grad_sync=True, encoder_grad_sync=True,
                        frozen_encoders=cm.frozen_encoders)
        others = _other_layouts(cm, plan, n, settings) if len(model.encoders) > 1 else []
        for k, sublayer in granularities(model.encoders[0].transformer.num_layers, pp_enc,
                                         pieces):
            if best is not None and best.iteration_s <= bound + 1e-12:
                break  # this plan's encoder is already fully hidden: nothing beats it
            for reverse in (False, True):
                if best is not None and best.iteration_s <= bound + 1e-12:
                    break
                costs = cm.optimus(plan, k, sublayer, reverse, others)
                layouts = [EncoderLayout(pp_enc, k, reverse)] + others
                hidden_all = False
                for kind in schedules:
                    if kind == "bubble" and hidden_all:
                        continue
                    problem = ScheduleProblem(pp, n, virtual_pipeline_model_parallel_size=vpp,
                                              encoder_trainable=cm.encoder_trainable,
                                              layouts=layouts, **settings)
                    s = add_expert_all_to_alls(
                        coarse(problem) if kind == "coarse" else
                        bubble(replace(problem, costs=costs.all_to_alls_folded()),
                               tp_bubbles=True),
                        cm.expert_chunks())
                    sim = simulate(s, costs, False)
                    c = Candidate(pp_enc, tp_enc, plan.encoder_data_parallel_size, k, reverse,
                                  kind, mbs, n, sim.iteration_s, sim.llm_only_iteration_s,
                                  sim.encoder_hidden_fraction, mem / GB, sublayer, others)
                    candidates.append(c)
                    schedules_of[id(c)] = s
                    hidden_all = sim.iteration_s <= sim.llm_only_iteration_s + 1e-12
                    if best is None or c.iteration_s < best.iteration_s - 1e-12:
                        best = c
    candidates.sort(key=lambda c: c.iteration_s)
    chosen = schedules_of[id(best)]
    validate(chosen)
    return EncoderSchedulePlan(
        model=model.name, layout=replace(layout, micro_batch_size=best.micro_batch_size),
        gpus=pp * tp * layout.data_parallel_size, baseline_vpp=baseline_vpp,
        baseline_iteration_s=baseline_s, interleaved_baseline_iteration_s=interleaved_s,
        best=best, schedule=chosen, candidates=candidates, rejected=rejected, pruned=pruned)

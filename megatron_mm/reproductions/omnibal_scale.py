"""OmniBal's ablation at the seed's own scale, from the cost model and the simulator.

The seed's experiment (InternViT-6B + InternLM2-20B on A100s, Megatron 3-D parallelism) as
four rows, each adding one of OmniBal's parts to Megatron-Core's way of training:

1. ``megatron``: random micro-batches of B samples, each padded to its longest sample;
   Megatron-Core's uniform layout (LLM layers split evenly, the ViT joins stage 0); full
   recompute of every transformer layer;
2. ``+ balanced data``: ISF packed groups (bounds searched for B samples per group), placed
   on the ranks by their work (``--data-balance isf-sorted``);
3. ``+ partition search``: OmniBal's candidates around the forward-time anchor
   (``partition_search.py``), each replayed on the first balanced steps, the fastest kept;
4. ``+ adaptive recompute``: per stage, the least recompute that fits the memory budget
   (``recompute_budget.py``) for the largest group the bounds allow.

Every micro-batch's work comes from real per-sample tile and token counts: encoder layers
scale with the tiles, LLM layers with each sample's length (a padded micro-batch runs B
sequences of its longest; a packed group each sample at its own length, as variable-length
attention does). Each data-parallel rank's pipeline is replayed with its own micro-batches'
costs (Megatron's 1F1B); a step lasts as long as its slowest rank, since the gradient
reduction waits for it. Not charged, because it is the same in every row: the gradient
reduction itself and the pipeline transfers. GPU-days = seconds per sample x the dataset's
samples x GPUs / 86400.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

from ..plan.balance.baselines import random_batches
from ..plan.balance.isf import Bounds, isf
from ..plan.balance.loads import SampleLoad
from ..plan.balance.rounds import sorted_rounds
from ..plan.balance.search import search_bounds
from ..plan.costs import flops
from ..plan.costs.hardware import A100, Hardware, MemoryModel
from ..plan.costs.unit_costs import TimeModel
from ..plan.errors import PlanError
from ..plan.model import EncoderSpec, ModelSpec, Workload, patch_embed_flops
from ..plan.pipeline.chain import build_chain
from ..plan.pipeline.inflight import inflight_microbatches
from ..plan.pipeline.layers import LLM, TRANSFORMER_KINDS, Layer
from ..plan.pipeline.partition import uniform_counts
from ..plan.pipeline.partition_search import candidates
from ..plan.pipeline.recompute_budget import GB, chunk_activations, choose_recompute, static_bytes
from ..plan.record import Record
from ..plan.schedules.generate import megatron
from ..plan.schedules.simulate import ActionCosts, simulate
from . import model_zoo

# The paper's A100 GPU-days for the four rows (6B + 20B, Megatron backend).
PAPER_GPU_DAYS = [61.8, 51.9, 29.0, 21.3]
ROWS = ["megatron", "+ balanced data", "+ partition search", "+ adaptive recompute"]


@dataclass
class ScaleSetup(Record):
    """The run being modelled. The paper does not state its parallel layout or batch: the
    defaults (TP 4, PP 4, DP 8 on 128 A100s, 1024 samples per step of micro-batches of 4)
    are assumptions, each a flag of ``tools/plan.py --omnibal-table``."""

    vision: str = "internvit-6b-448px-v1.5"
    llm: str = "internlm2.5-20b"  # InternLM2-20B's shape
    tile: int = 448
    pixel_shuffle: float = 0.5  # tokens per tile: (448 / 14)^2 x 0.5^2 = 256
    tensor_model_parallel_size: int = 4
    pipeline_model_parallel_size: int = 4
    data_parallel_size: int = 8
    global_batch_size: int = 1024  # samples per step
    micro_batch_size: int = 4  # samples per micro-batch (row 1); ISF groups aim at this
    memory_budget_gb: float = 72.0  # per GPU, for activations and model state (80 GB A100)
    dataset_samples: int = 1_200_000  # InternVL-1.2M: one epoch
    partition_candidates: int = 8  # BMP: the best-ranked candidates replayed
    partition_trial_steps: int = 8  # steps each candidate is replayed on
    seed: int = 0

    def __post_init__(self):
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                     "data_parallel_size", "global_batch_size", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise PlanError(f"--{name.replace('_', '-')} must be positive")
        if self.global_batch_size % (self.micro_batch_size * self.data_parallel_size):
            raise PlanError(f"--global-batch-size {self.global_batch_size} is not a multiple "
                            f"of --micro-batch-size x --data-parallel-size")

    @property
    def gpus(self) -> int:
        return (self.tensor_model_parallel_size * self.pipeline_model_parallel_size
                * self.data_parallel_size)

    @property
    def microbatches_per_step(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)


@dataclass
class AblationRow(Record):
    name: str
    layers_per_stage: List[int]
    recompute: str  # "full" or the chosen layers per stage
    seconds_per_step: float
    samples_per_second: float
    tokens_per_second: float  # LLM tokens of the samples (padding not counted)
    peak_memory_gb: float  # the most any rank holds (model state + activations)
    gpu_days: float
    paper_gpu_days: float


@dataclass
class Ablation(Record):
    setup: ScaleSetup
    model: str
    samples: int
    bounds: str  # the ISF bounds the balanced rows use
    rows: List[AblationRow] = field(default_factory=list)


def internvl_model(setup: ScaleSetup) -> ModelSpec:
    """InternViT (one tile per item) + pixel shuffle + InternVL's MLP projector + the LLM."""
    vit = model_zoo.VISION[setup.vision]
    llm = model_zoo.LLMS[setup.llm]
    t, p, h = vit.transformer, vit.patch, vit.transformer.hidden_size
    grid = setup.tile // p
    merge = round(1 / setup.pixel_shuffle ** 2)
    encoder = EncoderSpec(
        name="vision", modality="vision", transformer=t,
        tokens_per_item=grid * grid + int(vit.class_token),
        llm_tokens_per_item=grid * grid // merge,
        embed_flops_per_token=patch_embed_flops(p, h),
        embed_params=(3 * p * p + 1) * h + (grid * grid + 1) * h,
        projector_input_size=h * merge, projector_ffn_hidden_size=llm.hidden_size)
    return ModelSpec(name=f"{setup.vision} + {setup.llm}", encoders=[encoder], llm=llm)


class MicrobatchChains:
    """The layer chain of any micro-batch: ``chain(tiles, lengths, padded)``. Encoder-side
    layers cost ``tiles`` times one tile's; LLM layers the sum over the samples (padded: B
    sequences of the longest)."""

    def __init__(self, model: ModelSpec, tp: int):
        self.model, self.tp = model, tp
        per_sample = model.encoders[0].llm_tokens_per_item
        self.template = build_chain(model, Workload(seq_length=per_sample, micro_batch_size=1,
                                                    tensor_model_parallel_size=tp))

    @lru_cache(maxsize=None)
    def _llm_layer(self, layer: int, length: int) -> flops.Cost:
        """LLM layer ``layer`` on one sample of ``length`` tokens (its own kind: a hybrid's
        Gated DeltaNet layers are linear in the length, full attention quadratic)."""
        llm = self.model.llm
        kind = (llm.is_moe(layer), llm.is_linear(layer))
        return self._llm_kind(kind, length)

    @lru_cache(maxsize=None)
    def _llm_kind(self, kind, length: int) -> flops.Cost:
        moe, linear = kind
        return flops.transformer_layer(self.model.llm, 1, length, True, moe,
                                       linear=linear).split(self.tp)

    def chain(self, tiles: int, lengths: Sequence[int], padded: bool) -> List[Layer]:
        seqs = [max(lengths)] * len(lengths) if padded else list(lengths)
        tokens = sum(seqs)
        llm = self.model.llm
        out, index = [], 0
        for layer in self.template:
            if layer.branch != LLM:
                cost = _scaled(layer, tiles)
            elif layer.kind == "llm_layer":
                cost = flops.Cost(*(sum(v) for v in zip(
                    *(self._llm_layer(index, s) for s in seqs))))
                index += 1
            elif layer.kind == "llm_embed":
                cost = flops.llm_embed(llm, tokens).split(self.tp)
            else:
                cost = flops.llm_head(llm, tokens).split(self.tp)
            out.append(dataclasses.replace(
                layer, fwd_flops=cost.fwd, dgrad_flops=cost.dgrad, wgrad_flops=cost.wgrad,
                act_bytes=cost.act, recompute_act_bytes=cost.recompute_act,
                out_bytes=cost.out))
        return out


def _scaled(layer: Layer, k: float) -> flops.Cost:
    return flops.Cost(layer.fwd_flops * k, layer.dgrad_flops * k, layer.wgrad_flops * k,
                      layer.params, layer.act_bytes * k, layer.recompute_act_bytes * k,
                      layer.out_bytes * k)


def chunk_bounds(counts: Sequence[int]) -> List[Tuple[int, int]]:
    ends, run = [], 0
    for c in counts:
        ends.append((run, run + c))
        run += c
    return ends


def with_recompute(chain: Sequence[Layer], bounds, per_chunk: Optional[List[Dict[str, int]]]
                   ) -> List[Layer]:
    """Every transformer layer recomputed (``per_chunk`` None: full recompute), or the first
    N of each stack in each chunk (Megatron's block method, the adaptive choice)."""
    out = list(chain)
    for c, (start, end) in enumerate(bounds):
        seen: Dict[str, int] = {}
        for i in range(start, end):
            layer = out[i]
            if layer.kind not in TRANSFORMER_KINDS:
                continue
            k = seen.get(layer.branch, 0)
            seen[layer.branch] = k + 1
            on = per_chunk is None or k < per_chunk[c].get(layer.branch, 0)
            out[i] = dataclasses.replace(layer, recompute=on)
    return out


def stage_seconds(chain: Sequence[Layer], bounds, time: TimeModel):
    """(forward, backward) seconds of each chunk for this micro-batch."""
    fwd, bwd = zip(*(time.chunk_s(chain[s:e]) for s, e in bounds))
    return list(fwd), list(bwd)


def peak_memory(chains: Sequence[List[Layer]], bounds, pp: int, m: int,
                memory: MemoryModel) -> float:
    """The most any rank holds: model state + its in-flight micro-batches' activations,
    taking the largest micro-batch as the one in flight (an upper bound on 1F1B's peak)."""
    state = static_bytes(chains[0], bounds, pp, memory)
    worst = [0.0] * pp
    for chain in chains:
        for c, (s, e) in enumerate(bounds):
            acts = sum(l.stored_act_bytes for l in chain[s:e])
            held = inflight_microbatches(pp, 1, c % pp, m)[0]
            worst[c % pp] = max(worst[c % pp], held * acts)
    return max(a + b for a, b in zip(state, worst))


class AblationRun:
    """The data, chains and replays one ablation shares between its rows."""

    def __init__(self, loads: Sequence[SampleLoad], setup: ScaleSetup,
                 hardware: Hardware = A100, memory: Optional[MemoryModel] = None):
        if not loads:
            raise PlanError("no samples: give OmniBal's per-sample statistics")
        self.loads, self.setup, self.time = list(loads), setup, TimeModel(hardware)
        self.memory = memory or MemoryModel()
        self.model = internvl_model(setup)
        self.chains = MicrobatchChains(self.model, setup.tensor_model_parallel_size)
        self.pp = setup.pipeline_model_parallel_size
        self.schedule = megatron(self.pp, 1, setup.microbatches_per_step)

    def microbatch(self, ids: Sequence[int], padded: bool) -> List[Layer]:
        return self.chains.chain(sum(max(1, self.loads[i].vision) for i in ids),
                                 [self.loads[i].tokens for i in ids], padded)

    def steps(self, rounds: Sequence[List[List[int]]]) -> List[List[List[List[int]]]]:
        """Rounds (one micro-batch per DP rank) -> steps of ``microbatches_per_step``."""
        m = self.setup.microbatches_per_step
        return [list(rounds[k:k + m]) for k in range(0, len(rounds) - m + 1, m)]

    def step_seconds(self, step, padded: bool, bounds, recompute) -> float:
        """The slowest data-parallel rank's pipeline replay of its micro-batches."""
        slowest = 0.0
        for rank in range(self.setup.data_parallel_size):
            per_mb = []
            for round_ in step:
                chain = with_recompute(self.microbatch(round_[rank], padded), bounds, recompute)
                fwd, bwd = stage_seconds(chain, bounds, self.time)
                per_mb.append(ActionCosts(forward_s=fwd, backward_s=bwd))
            costs = ActionCosts(forward_s=per_mb[0].forward_s,
                                backward_s=per_mb[0].backward_s, microbatches=per_mb)
            slowest = max(slowest, simulate(self.schedule, costs, timeline=False).iteration_s)
        return slowest

    def row(self, name: str, steps, padded: bool, counts: List[int], recompute,
            peak_chains: Sequence[List[Layer]], paper: float) -> AblationRow:
        bounds = chunk_bounds(counts)
        total = sum(self.step_seconds(s, padded, bounds, recompute) for s in steps)
        samples = sum(len(mb) for s in steps for r in s for mb in r)
        tokens = sum(self.loads[i].tokens for s in steps for r in s for mb in r for i in mb)
        peak = peak_memory([with_recompute(c, bounds, recompute) for c in peak_chains],
                           bounds, self.pp, self.setup.microbatches_per_step, self.memory)
        per_sample = total / samples
        label = ("full" if recompute is None else
                 "; ".join(f"s{c}: " + (", ".join(f"{k} {v}" for k, v in sorted(d.items()))
                                        or "-") for c, d in enumerate(recompute)))
        return AblationRow(
            name=name, layers_per_stage=list(counts), recompute=label,
            seconds_per_step=total / len(steps), samples_per_second=samples / total,
            tokens_per_second=tokens / total, peak_memory_gb=peak / GB,
            gpu_days=per_sample * self.setup.dataset_samples * self.setup.gpus / 86400,
            paper_gpu_days=paper)


def run_ablation(loads: Sequence[SampleLoad], setup: ScaleSetup,
                 hardware: Hardware = A100) -> Ablation:
    """The four rows (module docstring)."""
    run = AblationRun(loads, setup, hardware)
    s, dp, pp = setup, setup.data_parallel_size, setup.pipeline_model_parallel_size
    rng = random.Random(s.seed)
    # Row 1: random micro-batches of B samples, padded; Megatron-Core's layout.
    mbs = random_batches(run.loads, s.micro_batch_size, rng)
    random_steps = run.steps([mbs[k:k + dp] for k in range(0, len(mbs) - dp + 1, dp)])
    if not random_steps:
        raise PlanError(f"{len(run.loads)} samples fill no step of {s.global_batch_size}: "
                        "give more statistics or a smaller --global-batch-size")
    uniform = uniform_counts(run.chains.template, pp)
    biggest_random = sorted(mbs, key=lambda ids: (max(run.loads[i].tokens for i in ids)
                                                  * len(ids)))[-1:]
    peak_random = [run.microbatch(ids, True) for ids in biggest_random]
    ablation = Ablation(setup=s, model=run.model.name, samples=len(run.loads), bounds="")
    ablation.rows.append(run.row(ROWS[0], random_steps, True, uniform, None, peak_random,
                                 PAPER_GPU_DAYS[0]))
    # Rows 2-4: ISF groups placed by work.
    best = search_bounds(run.loads, dp, s.micro_batch_size, "isf-sorted", seed=s.seed)
    bounds: Bounds = best.bounds
    ablation.bounds = str(bounds)
    grouping = isf(range(len(run.loads)), run.loads, bounds, 10, random.Random(s.seed))
    balanced_steps = run.steps(sorted_rounds(grouping.groups, run.loads, dp,
                                             random.Random(s.seed)))
    if not balanced_steps:
        raise PlanError(f"{len(run.loads)} samples fill no step of {s.global_batch_size}: "
                        "give more statistics or a smaller --global-batch-size")
    # The largest group the bounds allow: what adaptive recompute must fit.
    worst_group = run.chains.chain(bounds.max_vision, [bounds.max_tokens], False)
    ablation.rows.append(run.row(ROWS[1], balanced_steps, False, uniform, None,
                                 [worst_group], PAPER_GPU_DAYS[1]))
    # Row 3: BMP. Candidates ranked on a typical group's layer times, the best replayed.
    typical = run.microbatch(grouping.groups[len(grouping.groups) // 2], False)
    found = candidates(with_recompute(typical, [(0, len(typical))], None), pp)
    trials = balanced_steps[:s.partition_trial_steps]
    timed = [(sum(run.step_seconds(st, False, chunk_bounds(c.layers_per_chunk), None)
                  for st in trials), c.layers_per_chunk)
             for c in found[:s.partition_candidates]]
    searched = min(timed)[1]
    ablation.rows.append(run.row(ROWS[2], balanced_steps, False, searched, None,
                                 [worst_group], PAPER_GPU_DAYS[2]))
    # Row 4: recompute only what the budget needs, per stage, for the worst group.
    sb = chunk_bounds(searched)
    acts = chunk_activations(worst_group, sb, pp, 1, s.microbatches_per_step)
    choice = choose_recompute(acts, static_bytes(worst_group, sb, pp, run.memory),
                              s.memory_budget_gb * GB)
    ablation.rows.append(run.row(ROWS[3], balanced_steps, False, searched,
                                 choice.recompute_num_layers, [worst_group],
                                 PAPER_GPU_DAYS[3]))
    return ablation


def table(ab: Ablation) -> str:
    """The rows side by side, each with its ratio to the first, and the paper's."""
    s = ab.setup
    first, paper_first = ab.rows[0], ab.rows[0].paper_gpu_days
    lines = [
        f"> OmniBal's ablation at scale, simulated: {ab.model}, {s.gpus} A100s "
        f"(TP {s.tensor_model_parallel_size}, PP {s.pipeline_model_parallel_size}, "
        f"DP {s.data_parallel_size}), {s.global_batch_size} samples per step, micro-batches "
        f"of {s.micro_batch_size}; {ab.samples} samples of real tile / token counts; "
        f"ISF bounds {ab.bounds}",
        "| row | layers per stage | recompute (layers per stack, per stage) | s / step "
        "| tokens/s | speed-up | peak GB | GPU-days (1.2M, 1 epoch) | paper GPU-days "
        "| paper speed-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in ab.rows:
        lines.append(
            f"| {r.name} | {','.join(map(str, r.layers_per_stage))} | {r.recompute} "
            f"| {r.seconds_per_step:.2f} | {r.tokens_per_second:,.0f} "
            f"| {r.tokens_per_second / first.tokens_per_second:.2f}x | {r.peak_memory_gb:.1f} "
            f"| {r.gpu_days:.1f} | {r.paper_gpu_days} "
            f"| {paper_first / r.paper_gpu_days:.2f}x |")
    return "\n".join(lines)

"""Colocated, bubble-filled and separate encoder placements at cluster scale, simulated, for
Optimus' two models and a Qwen3-VL-sized one, beside the published figures of the systems
that place encoders on GPUs of their own.

Placements (each simulated by ``simulate.simulate`` on the cost model's ``ActionCosts``,
``plan/costs/hardware.py``'s GPUs at 50 % of peak and ``Interconnect``'s links):

- Megatron-LM: the encoder whole at the LLM's TP inside the first stage's chunk (Megatron-
  LM's pre-process; Megatron-Core's 1F1B, VPP 1, uniform LLM layers per stage);
- frozen-aware: the same schedule with the LLM layers split by cost (``minmax_split`` of
  each layer's forward + backward seconds, the encoder's on stage 0: its forward only when
  it is frozen), the partition ``--pipeline-partition auto`` makes; memory not checked;
- bubble: Optimus' encoder plan and schedule (``encoder_planner.plan_encoder_schedule``:
  encoder PP / TP, pieces, coarse or bubble), the planner's best;
- separate: the encoder on ranks of its own (``separate.separate``'s program), the best of
  a grid on the same GPU count: the LLM at the colocated run's TP, PP of half, the same or
  twice the colocated PP, every data-parallel size that leaves between one rank and half
  of the GPUs to the encoder, and encoder TP 1, 2, 4 or 8 with the data-parallel size the
  encoder ranks leave. Each LLM replica keeps the colocated run's micro-batches (its
  pipeline's shape), so the global batch is DP x micro-batches x micro-batch size: the
  placements are compared by samples per second on the same GPUs, the speed-up over
  Megatron-LM is the ratio of throughputs. LLM layouts must fit in memory with the
  encoder on their first stage (conservative: the encoder is not there); the encoder
  ranks' memory is not checked. Its costs: the LLM's chunks, the whole encoder at encoder
  TP (``CostModel.encoder_pieces``), the LLM's stage sends as the colocated runs' (1 / TP
  of the activation), each encoder output whole from the encoder replica's first rank to
  each of the LLM first stage's TP ranks and its gradient from the stage's first rank to
  each encoder TP rank (``TimeModel.fan_out_s``: TP and encoder TP copies on the sender's
  link, as the runtime sends them); the program has no collectives yet, so the LLM's
  gradient reduce-scatter is charged after its last backward (``llm_end_s``: as exposed
  as Megatron's first stage's) and the encoder's over its data-parallel ranks, which starts
  with it, adds what it takes beyond that (``grad_sync_s``); the encoder's parameter
  all-gather is not charged. The program is simulated for one cell of ``gcd(D, E)``: LLM
  replica d and encoder replica e talk only when d = e mod gcd (round-robin in need
  order), and the cells are identical, so one cell's iteration is the world's.

Models and workloads. Optimus (``optimus_reference``): ViT-22B + GPT-175B on 1536 H100
(TP 8, PP 8, DP 24, global batch 1536, micro-batch 2, 2048 tokens) and ViT-3B + GPT-11B
on 8 A100 (TP 2, PP 4, DP 1, global batch 16), 224 px images of 256 tokens: light = 2
per sample (``optimus_reference``'s assumption), heavy = 6. Qwen3-VL-32B (Hugging Face
``Qwen/Qwen3-VL-32B-Instruct`` config: text 64 layers, hidden 5120, FFN 25600 SwiGLU, 64
heads, 8 KV heads of 128, vocabulary 151936, untied; vision 27 layers, hidden 1152, MLP
4304, 16 heads, patch 16 over 2 frames, 2 x 2 merge, output 5120; DeepStack's mergers left
out) on 64 H100, assumed TP 8, PP 4, DP 2, global batch 128, micro-batch 1, 4096 tokens,
full recompute: light = one 512 x 512 image (1024 patches, 256 LLM tokens), heavy = 24
video frames at 512 x 512 (12 temporal patches of 2 frames, 3072 LLM tokens). Each with
the encoder trained or frozen (the LLM and projector train).

``encoder / bubble``: the encoder's seconds per GPU in an iteration (every micro-batch's
forward and, trained, backward at the LLM's TP, over the PP ranks) over the idle seconds
per GPU of the LLM's own 1F1B (the LLM without the encoder): Optimus' criterion for the
encoder fitting in the bubbles.

Published figures (``PUBLISHED``) are the systems' own, on their own setups; only where
the setup was found is it quoted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

from ..plan.costs.hardware import A100, A100_LINKS, H100, H100_LINKS
from ..plan.errors import PlanError
from ..plan.model import ModelSpec, TransformerSpec
from ..plan.pipeline.minmax import minmax_split, prefix_sums
from ..plan.record import Record
from ..plan.schedules.action_costs import CostModel, LLMLayout
from ..plan.schedules.encoder_planner import EncoderSchedulePlan, plan_encoder_schedule
from ..plan.schedules.generate import megatron
from ..plan.schedules.problem import ScheduleProblem
from ..plan.schedules.separate import separate
from ..plan.schedules.simulate import ActionCosts, simulate
from . import model_zoo
from .optimus_reference import RUNS as OPTIMUS_RUNS
from .qwen3_vl_moe_scale import qwen3_vl_vit

MEMORY = 0.9 * 80 * 1024 ** 3


@dataclass
class Setup(Record):
    model: str
    gpus: int
    hardware: str  # H100 | A100
    layout: LLMLayout  # the colocated runs' (VPP 1 for Megatron-LM)
    light: int  # media items per sample
    heavy: int
    pieces: Tuple[int, ...] = (1, 2, 4)  # the bubble planner's encoder pieces

    def links(self):
        return (H100, H100_LINKS) if self.hardware == "H100" else (A100, A100_LINKS)

    def spec(self, items: int, encoder_trains: bool) -> ModelSpec:
        if self.model.startswith("Optimus"):  # 224 x (224 n): n tiles of 256 tokens
            spec = model_zoo.model_pair(self.model, img_h=224, img_w=224 * items)
        else:
            vit = qwen3_vl_vit(5120, side=512)
            spec = ModelSpec(name=self.model, llm=QWEN3_32B, tied_embeddings=False,
                             encoders=[replace(vit, items_per_sample=items)])
        return spec.with_freeze(not encoder_trains, False, False)


QWEN3_32B = TransformerSpec(hidden_size=5120, num_layers=64, ffn_hidden_size=25600,
                            num_attention_heads=64, num_query_groups=8, kv_channels=128,
                            gated_linear_unit=True, vocab_size=151936)

SETUPS: List[Setup] = [
    Setup("Optimus-D-224", 1536, "H100", OPTIMUS_RUNS[0].layout, 2, 6),
    Setup("Optimus-small-224", 8, "A100", OPTIMUS_RUNS[3].layout, 2, 6),
    Setup("Qwen3-VL-32B", 64, "H100", LLMLayout(4, 8, 2, 1, 1, 128, 4096, True), 1, 12),
]


def _gpus(lay: LLMLayout) -> int:
    return (lay.pipeline_model_parallel_size * lay.tensor_model_parallel_size
            * lay.data_parallel_size)


@dataclass
class Published(Record):
    system: str
    figure: str
    setup: str
    source: str


PUBLISHED: List[Published] = [
    Published("Megatron-Core MIMO (heterogeneous parallelism)",
              "non-colocated: up to +13.0% aggregate tokens/s (+9.6% TFLOPS/GPU); colocated "
              "heterogeneous: up to +49.3% TFLOPS/GPU",
              "over optimized homogeneous (encoder in the LLM's layout) configurations, a "
              "sweep of multimodal workloads and GPU scales; the row of the +13.0% not found",
              "arXiv 2605.27678"),
    Published("Megatron-Bridge MegatronMIMO, Qwen3.5-VL tutorial",
              "+23% to +45% active tokens/s/GPU",
              "dense Qwen3.5-VL 27B full-parameter SFT, non-colocated (vision and language "
              "on disjoint GPUs), a 17-rank launch layout, against the standard Megatron "
              "Bridge path; the split of the ranks and the baseline's layout not found",
              "Megatron-Bridge tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md "
              "(PRs 4239, 4448)"),
    Published("DistTrain", "up to 2.2x training throughput over Megatron-LM; 54.7% MFU",
              "disaggregated encoder / LLM / generator with their own parallelism plus data "
              "reordering; the MFU on a 72B multimodal LLM on 1172 GPUs; the model and GPU "
              "count of the 2.2x not found", "arXiv 2408.04275 (SIGCOMM '25)"),
    Published("Optimus", " / ".join(f"{r.paper_speedup:.2f}x ({_gpus(r.layout)} {r.hardware})"
                                    for r in OPTIMUS_RUNS),
              "ViT-22B + GPT-175B and ViT-3B + GPT-11B, bubble-filled encoder against "
              "Megatron-LM (Tables 5 and 10; ``optimus_reference``)",
              "arXiv 2408.03505 (ATC '25)"),
    Published("LoongForge", "15% to 45% end-to-end multimodal training speed-up",
              "decoupled encoder / LLM training among other optimisations (FP8, MoE, load "
              "balance), over open-source baselines; no placement-only figure or setup found",
              "LoongForge announcement, 2026-04"),
]


# -- the placements ---------------------------------------------------------------------

def _megatron_s(cm: CostModel, costs: ActionCosts) -> float:
    lay = cm.layout
    return simulate(megatron(lay.pipeline_model_parallel_size, 1, lay.num_microbatches,
                             grad_sync=True), costs, False).iteration_s


def _vpp1(layout: LLMLayout) -> LLMLayout:
    return replace(layout, virtual_pipeline_model_parallel_size=1)


def megatron_lm_s(spec: ModelSpec, layout: LLMLayout, hw, links) -> float:
    cm = CostModel(spec, _vpp1(layout), hw, links)
    return _megatron_s(cm, cm.baseline())


def frozen_aware(spec: ModelSpec, layout: LLMLayout, hw, links) -> Tuple[float, List[int]]:
    """Megatron's schedule with the LLM layers split by cost, the encoder on stage 0:
    (iteration seconds, LLM layers per stage)."""
    cm = CostModel(spec, _vpp1(layout), hw, links)
    n = spec.llm.num_layers
    fwd, bwd = cm.llm_chunks([(i, i + 1) for i in range(n)])
    sums = prefix_sums([f + b for f, b in zip(fwd, bwd)])
    enc = sum(sum(p[0]) + sum(p[1]) for p in
              (cm.encoder_pieces(layout.tensor_model_parallel_size, 1, e=e)
               for e in range(len(spec.encoders))))
    _, counts = minmax_split(n, layout.pipeline_model_parallel_size,
                             lambda s, e, g: sums[e] - sums[s] + (enc if g == 0 else 0.0))
    ends = [sum(counts[:c + 1]) for c in range(len(counts))]
    cm.chunk_spans = list(zip([0] + ends[:-1], ends))
    return _megatron_s(cm, cm.baseline()), counts


def bubble(spec: ModelSpec, layout: LLMLayout, hw, links, pieces: Sequence[int]
           ) -> EncoderSchedulePlan:
    return plan_encoder_schedule(spec, layout, hw, links, pieces=pieces,
                                 micro_batch_sizes=[layout.micro_batch_size])


def encoder_over_bubble(spec: ModelSpec, layout: LLMLayout, hw, links) -> float:
    """The encoder's seconds per GPU over the LLM's own 1F1B idle seconds per GPU."""
    cm = CostModel(spec, _vpp1(layout), hw, links)
    fwd, bwd = cm.llm_chunks()
    llm = ActionCosts(fwd, bwd, p2p_s=cm.p2p_s(), llm_start_s=cm.dp_gather_s([]),
                      reduce_s=cm.reduce_s())
    lay = cm.layout
    sim = simulate(megatron(lay.pipeline_model_parallel_size, 1, lay.num_microbatches,
                            grad_sync=True), llm, False)
    tp = lay.tensor_model_parallel_size
    enc = sum(sum(f) + sum(b) for f, b, *_ in
              (cm.encoder_pieces(tp, 1, e=e) for e in range(len(spec.encoders))))
    per_gpu = enc * lay.num_microbatches / lay.pipeline_model_parallel_size
    return per_gpu / (sum(sim.idle_s) / len(sim.idle_s))


@dataclass
class SeparateChoice(Record):
    iteration_s: float
    global_batch_size: int
    pipeline_model_parallel_size: int
    data_parallel_size: int
    encoder_tensor_model_parallel_size: int
    encoder_data_parallel_size: int

    def describe(self, tp: int) -> str:
        return (f"LLM TP {tp} PP {self.pipeline_model_parallel_size} DP "
                f"{self.data_parallel_size}, global batch {self.global_batch_size}; encoder "
                f"{self.encoder_tensor_model_parallel_size} x "
                f"{self.encoder_data_parallel_size} ranks (TP x DP)")


def separate_costs(spec: ModelSpec, llm_layout: LLMLayout, etp: int, edp: int, hw, links
                   ) -> ActionCosts:
    """The separate program's costs (module docstring): the LLM on ``llm_layout``, ``edp``
    encoder replicas of ``etp`` ranks."""
    if len(spec.encoders) != 1:
        raise PlanError("the placement table's separate rows take one encoder")
    cm = CostModel(spec, llm_layout, hw, links)
    fwd, bwd = cm.llm_chunks()
    ef, eb, params, _, _ = cm.encoder_pieces(etp, 1)
    trains = not cm.frozen_encoders
    llm_reduce = max(cm.reduce_s())
    enc_reduce = cm.encoder_reduce_s(params, edp)[0] if trains else 0.0
    out = cm.encoders[0].act_bytes  # the encoder's output, whole (module docstring)
    return ActionCosts(fwd, bwd, ef, eb if trains else [], p2p_s=cm.p2p_s(),
                       llm_start_s=cm.dp_gather_s([]), llm_end_s=llm_reduce,
                       grad_sync_s=max(0.0, enc_reduce - llm_reduce),
                       encoder_output_p2p_s=[cm.time.fan_out_s(
                           out, llm_layout.tensor_model_parallel_size)],
                       encoder_grad_p2p_s=[cm.time.fan_out_s(out, etp)])


def separate_s(spec: ModelSpec, llm_layout: LLMLayout, etp: int, edp: int, hw, links,
               cell: bool = True) -> float:
    """The separate placement's simulated iteration on ``separate_costs``; ``cell``: one
    cell of ``gcd(D, E)`` replicas, else the whole world's program (module docstring)."""
    costs = separate_costs(spec, llm_layout, etp, edp, hw, links)
    d = llm_layout.data_parallel_size
    g = math.gcd(d, edp) if cell else 1  # one cell (module docstring)
    trains = bool(costs.encoder_backward_s)
    schedule = separate(ScheduleProblem(
        llm_layout.pipeline_model_parallel_size, llm_layout.num_microbatches,
        llm_data_parallel_size=d // g, encoder_data_parallel_size=edp // g,
        encoder_trainable=trains, costs=costs))
    return simulate(schedule, costs, False).iteration_s


def separate_grid(setup: Setup, spec: ModelSpec, max_cell: int = 8) -> List[SeparateChoice]:
    """Every separate placement of the module docstring's grid, simulated (cells of more
    than ``max_cell`` LLM replicas are skipped: the list scheduler's time grows fast)."""
    hw, links = setup.links()
    lay = _vpp1(setup.layout)
    tp, pp0 = lay.tensor_model_parallel_size, lay.pipeline_model_parallel_size
    m, mbs = lay.num_microbatches, lay.micro_batch_size
    out = []
    for pp in sorted({max(1, pp0 // 2), pp0, 2 * pp0}):
        if pp > spec.llm.num_layers:
            continue
        for dp in range(1, setup.gpus // (tp * pp) + 1):
            left = setup.gpus - tp * pp * dp
            if left < 1 or left > setup.gpus // 2:
                continue
            try:
                llm = replace(lay, pipeline_model_parallel_size=pp, data_parallel_size=dp,
                              global_batch_size=dp * m * mbs)
                if CostModel(spec, llm, hw, links).memory_bytes(None) > MEMORY:
                    continue
            except PlanError:
                continue
            for etp in (1, 2, 4, 8):
                if left % etp or dp // math.gcd(dp, left // etp) > max_cell:
                    continue
                out.append(SeparateChoice(separate_s(spec, llm, etp, left // etp, hw, links),
                                          llm.global_batch_size, pp, dp, etp, left // etp))
    return out


# -- the table --------------------------------------------------------------------------

@dataclass
class Row(Record):
    model: str
    gpus: int
    items: int
    workload: str  # light | heavy
    encoder_trains: bool
    encoder_over_bubble: float
    megatron_lm_s: float
    frozen_aware_s: float
    frozen_aware_layers: List[int]
    bubble_s: float
    bubble_plan: str
    separate: Optional[SeparateChoice]
    separate_tried: int

    global_batch_size: int = 0

    def speedups(self) -> dict:
        """Each placement's samples per second over Megatron-LM's."""
        out = {"frozen-aware": self.megatron_lm_s / self.frozen_aware_s,
               "bubble": self.megatron_lm_s / self.bubble_s}
        if self.separate is not None:
            out["separate"] = (self.separate.global_batch_size / self.separate.iteration_s
                               * self.megatron_lm_s / self.global_batch_size)
        return out

    @property
    def best(self) -> str:
        ups = dict(self.speedups(), **{"Megatron-LM": 1.0})
        return max(ups, key=ups.get)


def row(setup: Setup, workload: str, encoder_trains: bool) -> Row:
    hw, links = setup.links()
    items = setup.light if workload == "light" else setup.heavy
    spec = setup.spec(items, encoder_trains)
    lay = setup.layout
    fa_s, counts = frozen_aware(spec, lay, hw, links)
    plan = bubble(spec, lay, hw, links, setup.pieces)
    grid = separate_grid(setup, spec)
    return Row(setup.model, setup.gpus, items, workload, encoder_trains,
               encoder_over_bubble(spec, lay, hw, links), megatron_lm_s(spec, lay, hw, links),
               fa_s, counts, plan.iteration_s, plan.best.describe(),
               max(grid, key=lambda c: c.global_batch_size / c.iteration_s) if grid else None,
               len(grid), lay.global_batch_size)


def rows(setups: Sequence[Setup] = SETUPS) -> List[Row]:
    return [row(s, w, t) for s in setups for w in ("light", "heavy") for t in (True, False)]


def table(results: Sequence[Row], setups: Sequence[Setup] = SETUPS) -> List[str]:
    """Markdown lines: the simulated rows, then the published figures."""
    tp = {s.model: s.layout.tensor_model_parallel_size for s in setups}
    lines = ["| model | GPUs | media per sample | encoder | encoder / bubble | Megatron-LM s | "
             "frozen-aware s | bubble s | separate s | best | bubble plan | separate plan |",
             "| --- " * 12 + "|"]

    for r in results:
        sep, up = r.separate, r.speedups()
        lines.append(
            f"| {r.model} | {r.gpus} | {r.items} ({r.workload}) | "
            f"{'trained' if r.encoder_trains else 'frozen'} | {r.encoder_over_bubble:.2f} | "
            f"{r.megatron_lm_s:.2f} | {r.frozen_aware_s:.2f} ({up['frozen-aware']:.2f}x) | "
            f"{r.bubble_s:.2f} ({up['bubble']:.2f}x) | "
            + (f"{sep.iteration_s:.2f} ({up['separate']:.2f}x)" if sep else "-")
            + f" | {r.best} | "
            f"{r.bubble_plan} | "
            f"{sep.describe(tp[r.model]) + f' (best of {r.separate_tried})' if sep else '-'} |")
    lines += ["", "| system | published figure | its setup | source |", "| --- " * 4 + "|"]
    lines += [f"| {p.system} | {p.figure} | {p.setup} | {p.source} |" for p in PUBLISHED]
    return lines

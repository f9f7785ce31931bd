"""Qwen3-VL-30B-A3B and 235B-A22B on H100 nodes: Megatron-Bridge's published parallel
layouts against the layout and encoder schedule this package's planner picks, simulated.

Model sizes (Hugging Face ``Qwen3VLMoeConfig``s of the two checkpoints): the LLMs are
Qwen3-MoE, every layer sparse (``decoder_sparse_step`` 1, no ``mlp_only_layers``), 128
experts, top-8, GQA with 4 KV heads of 128 channels, vocabulary 151936 -- 30B-A3B: 48
layers, hidden 2048, 32 heads, experts of 768; 235B-A22B: 94 layers, hidden 4096, 64
heads, experts of 1536. The ViT (both): 27 layers, hidden 1152, MLP 4304, 16 heads,
patch 16 over 2 frames, 2 x 2 patches merged into one LLM token by the merger (LayerNorm,
Linear 4608 -> 4608, GELU, Linear -> the LLM's hidden). DeepStack's three extra mergers
(ViT layers 8 / 16 / 24 added into the first LLM layers) are left out of the costs.

Megatron-Bridge's H100 pre-training recipes (``recipes/qwen_vl/h100/qwen3_vl.py``):
30B-A3B on 8 GPUs at TP 4, PP 2, EP 4, sequence parallel; 235B-A22B on 256 GPUs at TP 4,
PP 16, CP 2, EP 8; sequence 4096. Both freeze the LLM and the ViT (a mock projector run,
no recompute); here everything trains, with full recompute (``--recompute-granularity
full``: without it the encoder's activations of the micro-batches in flight do not fit). Megatron-
Core's expert grid needs ETP x EP to divide TP x DP, so EP 4 at TP 4 on 8 GPUs (DP 1) runs
at ETP 1, taken for every layout here. The cost model has no context parallelism: CP 2 is
counted as DP 2 (the same GPUs, tokens and FLOPs per GPU but for attention's quadratic
part; CP's key / value exchange not charged).

Assumed, not published: one 1024 x 1024 image per 4096-token sample (4096 patches, 1024
LLM tokens), global batch 64 (30B-A3B) / 256 (235B-A22B), micro-batch 1; H100 at 50 % of
peak, ``Interconnect``'s links (NVLink in a node of 8, 400 Gb/s RDMA between nodes).

The planner's pick: every LLM layout on the same GPUs (TP 1-8 in a node, PP dividing the
GPUs, EP dividing the experts and TP x DP), each simulated with Megatron's schedule
(the encoder in the first chunk); the ``shortlist`` fastest of them and Bridge's get the
Optimus encoder planner (``encoder_planner.plan_encoder_schedule``: encoder PP / TP, pieces,
placement, coarse or bubble, their expert all-to-alls as actions), and the fastest plan
wins. tokens/s = global batch x sequence / iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from ..plan.costs.hardware import H100, H100_LINKS
from ..plan.errors import PlanError
from ..plan.model import EncoderSpec, ModelSpec, TransformerSpec, patch_embed_flops
from ..plan.record import Record
from ..plan.schedules.action_costs import CostModel, LLMLayout
from ..plan.schedules.collectives import add_expert_all_to_alls
from ..plan.schedules.encoder_planner import EncoderSchedulePlan, plan_encoder_schedule
from ..plan.schedules.generate import megatron
from ..plan.schedules.simulate import simulate

SEQ = 4096
IMAGE_SIDE = 1024


def qwen3_vl_vit(out_hidden: int, side: int = IMAGE_SIDE) -> EncoderSpec:
    patches = (side // 16) ** 2
    vit = TransformerSpec(hidden_size=1152, num_layers=27, ffn_hidden_size=4304,
                          num_attention_heads=16, add_bias_linear=True)
    return EncoderSpec(name="vision", modality="vision", transformer=vit,
                       tokens_per_item=patches, llm_tokens_per_item=patches // 4,
                       embed_flops_per_token=patch_embed_flops(16, 1152, frames=2),
                       embed_params=(3 * 2 * 16 * 16 + 1) * 1152 + 2304 * 1152,
                       projector_input_size=4 * 1152, projector_ffn_hidden_size=4 * 1152)


def _qwen3_moe(hidden, layers, heads, expert_ffn, dense_ffn) -> TransformerSpec:
    return TransformerSpec(hidden_size=hidden, num_layers=layers, ffn_hidden_size=dense_ffn,
                           num_attention_heads=heads, num_query_groups=4, kv_channels=128,
                           gated_linear_unit=True, num_experts=128, moe_router_topk=8,
                           moe_ffn_hidden_size=expert_ffn, vocab_size=151936)


def model(name: str) -> ModelSpec:
    llm = {"Qwen3-VL-30B-A3B": _qwen3_moe(2048, 48, 32, 768, 6144),
           "Qwen3-VL-235B-A22B": _qwen3_moe(4096, 94, 64, 1536, 12288)}[name]
    return ModelSpec(name=name, encoders=[qwen3_vl_vit(llm.hidden_size)], llm=llm,
                     tied_embeddings=False)


@dataclass
class BridgeRun(Record):
    model: str
    gpus: int
    tp: int
    pp: int
    ep: int
    cp: int
    global_batch_size: int

    def layout(self) -> LLMLayout:
        return _layout(self.gpus, self.tp, self.pp, self.ep, self.global_batch_size)


RUNS: List[BridgeRun] = [BridgeRun("Qwen3-VL-30B-A3B", 8, 4, 2, 4, 1, 64),
                         BridgeRun("Qwen3-VL-235B-A22B", 256, 4, 16, 8, 2, 256)]


def _layout(gpus: int, tp: int, pp: int, ep: int, gbs: int) -> LLMLayout:
    return LLMLayout(pipeline_model_parallel_size=pp, tensor_model_parallel_size=tp,
                     data_parallel_size=gpus // (tp * pp), global_batch_size=gbs,
                     seq_length=SEQ, recompute=True, expert_model_parallel_size=ep,
                     expert_tensor_parallel_size=1)


def megatron_s(spec: ModelSpec, layout: LLMLayout) -> float:
    """Megatron's 1F1B with the encoder in the first chunk, expert all-to-alls charged."""
    cm = CostModel(spec, layout, H100, H100_LINKS)
    schedule = add_expert_all_to_alls(megatron(layout.pipeline_model_parallel_size, 1,
                                               layout.num_microbatches, grad_sync=True),
                                      cm.expert_chunks())
    return simulate(schedule, cm.baseline(), False).iteration_s


def layouts(spec: ModelSpec, gpus: int, gbs: int) -> List[LLMLayout]:
    """Every LLM layout on ``gpus`` GPUs that fits in memory with the encoder on the first
    stage (Megatron's placement)."""
    out = []
    for tp in (1, 2, 4, 8):
        for pp in [p for p in range(1, gpus // tp + 1) if gpus % (tp * p) == 0]:
            for ep in [e for e in (1, 2, 4, 8, 16, 32, 64, 128)
                       if spec.llm.num_experts % e == 0]:
                try:
                    lay = _layout(gpus, tp, pp, ep, gbs)
                    cm = CostModel(spec, lay, H100, H100_LINKS)
                except PlanError:
                    continue
                if cm.memory_bytes(None) <= 0.9 * 80 * 1024 ** 3:
                    out.append(lay)
    return out


@dataclass
class Row(Record):
    what: str
    layout: str
    schedule: str
    iteration_s: float
    tokens_per_s: float
    hidden: Optional[float]  # the share of encoder work hidden in the LLM's bubbles


def _describe(lay: LLMLayout, cp: int = 1) -> str:
    dp = lay.data_parallel_size // cp
    return (f"TP {lay.tensor_model_parallel_size} PP {lay.pipeline_model_parallel_size} "
            f"EP {lay.expert_model_parallel_size}" + (f" CP {cp}" if cp > 1 else "")
            + f" DP {dp}")


def _planned(spec, lay, pieces) -> EncoderSchedulePlan:
    return plan_encoder_schedule(spec, lay, H100, H100_LINKS, pieces=pieces,
                                 micro_batch_sizes=[1])


def compare(run: BridgeRun, shortlist: int = 2, pieces=(1, 2)) -> Tuple[List[Row], dict]:
    """Bridge's layout with Megatron's schedule, the same layout with the planner's
    encoder schedule, and the planner's layout and schedule."""
    spec = model(run.model)
    tokens = run.global_batch_size * SEQ
    bridge = run.layout()
    rows = [Row("Megatron-Bridge", _describe(bridge, run.cp), "megatron",
                megatron_s(spec, bridge), 0.0, None)]
    plan = _planned(spec, bridge, pieces)
    rows.append(Row("Bridge's layout, planned schedule", _describe(bridge, run.cp),
                    plan.best.describe(), plan.iteration_s, 0.0, plan.encoder_hidden_fraction))
    found = sorted(layouts(spec, run.gpus, run.global_batch_size),
                   key=lambda lay: megatron_s(spec, lay))
    best = (bridge, plan)  # Bridge's layout is a candidate too
    for lay in found[:shortlist]:
        try:
            p = _planned(spec, lay, pieces)
        except PlanError:
            continue
        if p.iteration_s < best[1].iteration_s:
            best = (lay, p)
    lay, p = best
    rows.append(Row("planner (Megatron schedule)", _describe(found[0]), "megatron",
                    megatron_s(spec, found[0]), 0.0, None))
    rows.append(Row("planner", _describe(lay, run.cp if lay is bridge else 1),
                    p.best.describe(), p.iteration_s, 0.0,
                    p.encoder_hidden_fraction))
    rows = [replace(r, tokens_per_s=tokens / r.iteration_s) for r in rows]
    return rows, {"layouts": len(found)}


def table(runs: List[BridgeRun] = RUNS, shortlist: int = 2) -> List[str]:
    lines = ["| model | GPUs | plan | layout | schedule | iteration s | tokens/s | "
             "encoder hidden |", "| --- " * 8 + "|"]
    for run in runs:
        rows, info = compare(run, shortlist)
        for r in rows:
            hidden = "-" if r.hidden is None else f"{100 * r.hidden:.1f}%"
            lines.append(f"| {run.model} | {run.gpus} | {r.what} | {r.layout} | "
                         f"{r.schedule} | {r.iteration_s:.3f} | {r.tokens_per_s:,.0f} | "
                         f"{hidden} |")
        lines.append(f"| | | ({info['layouts']} layouts fit; the {shortlist} fastest under "
                     "Megatron's schedule and Bridge's planned) | | | | | |")
    return lines

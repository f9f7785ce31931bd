"""Qwen3.5-27B on 16 H100s: the pipeline partition of a hybrid LLM, simulated.

The model (``model_zoo``'s ``Qwen3.5-27B`` pair): 64 LLM layers, three Gated DeltaNet layers
(linear in the sequence) then one gated full-attention layer (quadratic) in turn, and
Qwen3-VL's ViT without DeepStack (27 layers, hidden 1152). The layout is Megatron-Bridge's
H100 pre-training recipe for it (``recipes/qwen_vl/h100/qwen35_vl.py``,
``qwen35_vl_27b_pretrain_16gpu_h100_bf16_mock_config``): TP 4, PP 4, sequence 4096; here
everything trains with full recompute, and the sequence grows to Qwen3.5's long contexts,
where a full-attention layer costs several Gated DeltaNet layers.

Rows per sequence length, each the one time model's estimate of a 1F1B iteration
(``pipeline/estimate.py``) of the true hybrid's layer costs:

- ``uniform``: Megatron-Core's layout (LLM layers split evenly, the ViT on stage 0);
- ``auto, attention-only costs``: the frozen-aware min-max partition computed as if every
  LLM layer were full attention (a planner that does not know linear attention), run on
  the hybrid;
- ``auto``: the same partition search on the hybrid's own layer costs.

Assumed, not published: one 1024 x 1024 image per sample (4096 patches, 1024 LLM tokens),
32 micro-batches of one sample per iteration (DP 1), H100 at 50 % of its bf16 peak, no
pipeline transfer costs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Sequence

from ..plan.costs.hardware import H100
from ..plan.model import ModelSpec, Workload
from ..plan.pipeline.chain import build_chain
from ..plan.pipeline.estimate import estimate
from ..plan.pipeline.partition import partition
from ..plan.record import Record
from . import model_zoo

TP, PP, MICROBATCHES = 4, 4, 32
SEQUENCES = (4096, 32768, 131072)


def model() -> ModelSpec:
    spec = model_zoo.model_pair("Qwen3.5-27B", img_h=1024, img_w=1024)
    return dataclasses.replace(spec, tied_embeddings=False)  # Qwen3.5-27B: untied


def attention_only(spec: ModelSpec) -> ModelSpec:
    """The same model with every LLM layer full attention."""
    llm = dataclasses.replace(spec.llm, linear_attention=None, linear_attention_freq=[])
    return dataclasses.replace(spec, llm=llm)


@dataclass
class Row(Record):
    seq_length: int
    policy: str
    layers_per_stage: List[int]  # chain entries per stage (ViT layers, embeddings included)
    llm_layers_per_stage: List[int]
    iteration_s: float
    bottleneck_s: float  # the slowest stage's work per micro-batch
    peak_gib: float  # the fullest stage's model state and in-flight activations

    @property
    def tokens_per_s(self) -> float:
        return MICROBATCHES * self.seq_length / self.iteration_s


def rows(seq_length: int) -> List[Row]:
    spec = model()
    work = Workload(seq_length=seq_length, recompute=True, tensor_model_parallel_size=TP)
    chain = build_chain(spec, work)
    blind = partition(build_chain(attention_only(spec), work), PP, 1, "auto").layers_per_chunk
    out = []
    for name, policy in (("uniform", "uniform"), ("auto, attention-only costs", blind),
                         ("auto", "auto")):
        part = partition(chain, PP, 1, policy)
        est = estimate(chain, part, MICROBATCHES, H100)
        llm = [sum(l.kind == "llm_layer" for l in chain[s:e]) for s, e in part.chunk_bounds()]
        out.append(Row(seq_length, name, list(part.layers_per_chunk), llm, est.iteration_s,
                       max(est.stage_time_s), max(est.stage_memory_bytes) / 1024 ** 3))
    return out


def table(sequences: Sequence[int] = SEQUENCES) -> List[str]:
    lines = ["| sequence | partition | LLM layers per stage | iteration s | slowest stage s "
             "| tokens/s | vs uniform | peak GiB |", "| --- " * 8 + "|"]
    for seq in sequences:
        rs = rows(seq)
        for r in rs:
            lines.append(f"| {seq} | {r.policy} | {' / '.join(map(str, r.llm_layers_per_stage))}"
                         f" | {r.iteration_s:.2f} | {r.bottleneck_s:.3f} | "
                         f"{r.tokens_per_s:,.0f} | {rs[0].iteration_s / r.iteration_s:.3f}x | "
                         f"{r.peak_gib:.1f} |")
    return lines

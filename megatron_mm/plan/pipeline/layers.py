"""The layer chain and the frozen-aware backward rule.

A model is planned as a chain of layers in execution order: the LLM's word embedding, each
encoder (embed, its transformer layers, its projector, which merges its features into the
text embeddings), then the LLM's decoder layers and output layer + loss. A layer carries its own
costs per micro-batch; what its backward costs depends on freezing:

- input-gradient part (``dgrad_flops``): runs iff some trainable parameter lies upstream of
  the layer in the dataflow, strictly before it (otherwise autograd never reaches it);
- weight-gradient part (``wgrad_flops``): runs iff the layer itself is trainable;
- recompute adds one forward, but only where a backward runs.

So a frozen encoder costs F per layer, a frozen LLM behind a trainable projector about 2F,
a trainable layer 3F (each + F with recompute where backward runs). "Upstream" follows the
dataflow, not just the chain order: encoders do not feed each other, so a trainable vision
projector makes the LLM need input gradients but not an audio encoder placed after it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Sequence

from ..errors import PlanError
from ..record import Record

LLM = "llm"  # the LLM's branch name; encoders use their own names ("vision", "audio")
ENCODER_KINDS = ("vision_embed", "vision_layer", "audio_embed", "audio_layer", "projector")
LLM_KINDS = ("llm_embed", "llm_layer", "llm_head")
KINDS = ENCODER_KINDS + LLM_KINDS
TRANSFORMER_KINDS = ("vision_layer", "audio_layer", "llm_layer")


@dataclass
class Layer(Record):
    """One pipeline-placeable unit; FLOPs and bytes are per micro-batch on one TP rank."""

    kind: str  # one of KINDS
    module: str  # dotted name in MultimodalModel, e.g. language_model.decoder.layers.3
    branch: str  # dataflow branch: an encoder's name, or "llm"
    fwd_flops: float
    dgrad_flops: float  # input-gradient part of the backward
    wgrad_flops: float  # weight-gradient part of the backward
    params: float
    act_bytes: float  # saved for backward without recompute
    recompute_act_bytes: float  # saved for backward with recompute (the layer input)
    out_bytes: float  # the output tensor: what a stage boundary after this layer sends
    trainable: bool
    recompute: bool = False
    needs_dgrad: bool = False  # set by resolve_backward from the chain
    # Of ``params``, those that are the word embedding's own (a tied output layer): one
    # tensor where the same pipeline rank holds the embedding (PP=1), a copy elsewhere.
    tied_params: float = 0.0
    # DeepStack (Qwen3-VL) features a stage boundary after this layer sends beside its
    # output: the DeepStack encoder layers' outputs computed so far (inside the encoder),
    # or the merged features of the LLM layers still to come (after the mergers)
    deepstack_bytes: float = 0.0
    # An MoE layer at expert parallelism: the bytes each of its expert all-to-alls sends
    # off this rank (2 per forward: dispatch and combine; as many per backward), over an
    # expert-parallel group spanning ``a2a_span`` GPUs (Megatron's ranks TP x EP).
    a2a_bytes: float = 0.0
    a2a_span: int = 1
    # Of ``params``, the routed experts' share this rank holds (1 / (EP x expert TP) of
    # them): the distributed optimizer shards their state over the expert data-parallel
    # group, not the data-parallel one (``MemoryModel.bytes_per_trainable_expert_param``).
    expert_params: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise PlanError(f"layer {self.module!r}: unknown kind {self.kind!r}; "
                            f"expected one of {', '.join(KINDS)}")

    @property
    def runs_backward(self) -> bool:
        return self.needs_dgrad or self.trainable

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs, recompute included (it runs inside the backward pass)."""
        flops = (self.dgrad_flops if self.needs_dgrad else 0.0)
        flops += (self.wgrad_flops if self.trainable else 0.0)
        if self.recompute and self.runs_backward:
            flops += self.fwd_flops
        return flops

    @property
    def total_flops(self) -> float:
        return self.fwd_flops + self.bwd_flops

    @property
    def stored_act_bytes(self) -> float:
        """Activation bytes one in-flight micro-batch keeps here until its backward."""
        if not self.runs_backward:
            return 0.0  # no autograd graph: the runtime runs it under no_grad
        return self.recompute_act_bytes if self.recompute else self.act_bytes


def resolve_backward(chain: Sequence[Layer]) -> List[Layer]:
    """Copies of the layers with ``needs_dgrad`` set by the upstream rule (module docstring).

    Every encoder branch feeds the LLM; encoder branches do not feed each other.
    """
    validate_chain(chain)
    any_encoder_trainable = any(l.trainable for l in chain if l.branch != LLM)
    seen = {}  # branch -> a trainable layer was seen earlier in that branch
    out = []
    for layer in chain:
        upstream = seen.get(layer.branch, False)
        if layer.branch == LLM and layer.kind != "llm_embed":  # after the merge
            upstream = upstream or any_encoder_trainable
        out.append(dataclasses.replace(layer, needs_dgrad=upstream))
        seen[layer.branch] = seen.get(layer.branch, False) or layer.trainable
    return out


def validate_chain(chain: Sequence[Layer]) -> None:
    """The LLM embedding first; encoder branches, each contiguous; the LLM's decoder layers
    and head last."""
    if not chain:
        raise PlanError("the layer chain is empty")
    if chain[0].kind != "llm_embed":
        raise PlanError("the chain must start with the LLM embedding (llm_embed), which "
                        "Megatron-Core keeps on the first pipeline stage")
    llm = [i for i, l in enumerate(chain) if l.branch == LLM and i > 0]
    if not llm or llm != list(range(llm[0], len(chain))):
        raise PlanError("the chain must end with the LLM's layers (llm_layer ... llm_head), "
                        "after every encoder")
    for i in [0] + llm:
        if chain[i].kind not in LLM_KINDS or (i > 0 and chain[i].kind == "llm_embed"):
            raise PlanError(f"layer {chain[i].module!r} of kind {chain[i].kind} is out of "
                            "place in the LLM branch (llm_embed first, then llm_layer ... "
                            "llm_head)")
    closed = set()
    for prev, layer in zip(chain[1:], chain[2:]):
        if layer.branch != prev.branch:
            closed.add(prev.branch)
            if layer.branch in closed:
                raise PlanError(f"encoder branch {layer.branch!r} is split by another branch; "
                                "each encoder's layers must be contiguous in the chain")

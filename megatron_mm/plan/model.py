"""What is being planned: model sizes, freezing, and the per-micro-batch workload.

Sizes only; no weights. ``megatron_mm.families.model_spec`` builds a ``ModelSpec`` from
the training configuration (``megatron_mm.config``) so the planner and the trainer describe
the same model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..config import ConfigError, LinearAttentionConfig
from .errors import PlanError
from .record import Record


@dataclass
class LinearAttentionSpec(Record):
    """A Gated DeltaNet (linear attention) layer's sizes: Megatron-Core's ``GatedDeltaNet``
    by Megatron-LM's flag names (``--linear-key-head-dim`` ...). Query / key heads are
    repeated up to the value heads (grouped, as GQA); the chunked delta rule runs
    ``chunk_size`` tokens at a time."""

    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    chunk_size: int = 64

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise PlanError(f"--{f.name.replace('_', '-')} must be positive, "
                                f"got {getattr(self, f.name)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise PlanError(f"--linear-num-value-heads ({self.linear_num_value_heads}) must "
                            f"be a multiple of --linear-num-key-heads "
                            f"({self.linear_num_key_heads})")

    @property
    def qk_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def v_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim


def linear_attention_pattern(linear_attention_freq, num_layers: int) -> List[int]:
    """Megatron-LM's ``--linear-attention-freq``: an int N (layer i full attention when
    (i + 1) % N == 0, Gated DeltaNet otherwise) or one 0/1 per layer (1: linear); the rule
    is the model config's (``config.LinearAttentionConfig.pattern``)."""
    try:
        return list(LinearAttentionConfig(linear_attention_freq).pattern(num_layers))
    except ConfigError as e:
        raise PlanError(str(e)) from None


@dataclass
class TransformerSpec(Record):
    """One transformer stack; names follow Megatron's TransformerConfig."""

    hidden_size: int
    num_layers: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: Optional[int] = None  # GQA; None: multi-head
    kv_channels: Optional[int] = None  # head dim; None: hidden / heads (Gemma-2 differs)
    gated_linear_unit: bool = False  # SwiGLU / GeGLU: three FFN matrices instead of two
    add_bias_linear: bool = False
    num_experts: int = 1  # MoE: parameters of all experts, FLOPs of the routed top-k
    moe_router_topk: int = 1
    vocab_size: int = 0  # LLMs only
    moe_ffn_hidden_size: Optional[int] = None  # each expert's; None: ffn_hidden_size
    moe_shared_expert_intermediate_size: int = 0  # shared experts (every token), 0: none
    # One 0/1 per layer (1: MoE; Megatron's --moe-layer-freq list, Hugging Face's
    # decoder_sparse_step / mlp_only_layers); empty: every layer MoE with num_experts > 1.
    moe_layer_freq: List[int] = field(default_factory=list)
    # Gated attention (Qwen3.5): the query projection also yields a per-channel output gate
    attention_output_gate: bool = False
    # A hybrid stack (Qwen3.5, Qwen3-Next): the Gated DeltaNet layers' sizes, and one 0/1
    # per layer (1: Gated DeltaNet, 0: full attention; ``linear_attention_pattern``)
    linear_attention: Optional[LinearAttentionSpec] = None
    linear_attention_freq: List[int] = field(default_factory=list)

    def __post_init__(self):
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise PlanError(f"hidden size {self.hidden_size} is not divisible by "
                                f"{self.num_attention_heads} heads; give kv_channels")
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_query_groups:
            raise PlanError(f"{self.num_attention_heads} heads are not divisible by "
                            f"{self.num_query_groups} query groups")
        for name in ("hidden_size", "num_layers", "ffn_hidden_size", "num_attention_heads"):
            if getattr(self, name) <= 0:
                raise PlanError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.moe_router_topk <= self.num_experts:
            raise PlanError(f"top-{self.moe_router_topk} routing needs 1 to num_experts "
                            f"({self.num_experts}) experts per token")
        if self.moe_layer_freq and len(self.moe_layer_freq) != self.num_layers:
            raise PlanError(f"moe_layer_freq lists {len(self.moe_layer_freq)} layers; the "
                            f"stack has {self.num_layers}")
        if (self.linear_attention is None) != (not self.linear_attention_freq):
            raise PlanError("a hybrid stack needs both the Gated DeltaNet sizes "
                            "(linear_attention) and the per-layer pattern "
                            "(linear_attention_freq)")
        if self.linear_attention_freq:
            self.linear_attention_freq = linear_attention_pattern(
                list(self.linear_attention_freq), self.num_layers)

    def is_linear(self, layer: int) -> bool:
        """Whether layer ``layer`` is a Gated DeltaNet layer (else full attention)."""
        return bool(self.linear_attention_freq) and bool(self.linear_attention_freq[layer])

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is the experts (else the dense ``ffn_hidden_size``)."""
        return self.num_experts > 1 and (not self.moe_layer_freq
                                         or bool(self.moe_layer_freq[layer]))

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_dim(self) -> int:
        return self.num_query_groups * self.kv_channels


@dataclass
class EncoderSpec(Record):
    """An encoder and its projector. ``name`` prefixes the modules: vision -> vision_model."""

    name: str
    modality: str  # vision | audio (the layer kinds)
    transformer: TransformerSpec
    tokens_per_item: int  # encoder sequence per image tile / audio clip
    llm_tokens_per_item: int  # tokens handed to the LLM after the encoder's own merge/pool
    items_per_sample: int = 1
    embed_flops_per_token: float = 0.0  # forward FLOPs of the patch / conv stem per token
    embed_params: int = 0
    projector_input_size: Optional[int] = None  # default: the encoder's hidden size
    projector_ffn_hidden_size: Optional[int] = None  # default: the LLM's hidden size
    projector_type: str = "mlp"  # mlp: Linear-GELU-Linear (LLaVA); affine: one Linear
    # Tokens of each attention segment of one item (a frame, a window) when its tokens do
    # not all attend to each other; empty: the whole item (attention quadratic in it)
    attention_spans: Tuple[int, ...] = ()
    # DeepStack (Qwen3-VL): the encoder layers whose outputs, each through a merger of its
    # own (the projector's shape), are added after the first LLM layers (one per layer)
    deepstack_layers: Tuple[int, ...] = ()

    def __post_init__(self):
        if self.modality not in ("vision", "audio"):
            raise PlanError(f"encoder {self.name!r}: modality must be vision or audio, "
                            f"got {self.modality!r}")
        if self.projector_type not in ("mlp", "affine"):
            raise PlanError(f"encoder {self.name!r}: projector type must be mlp or affine")
        if min(self.tokens_per_item, self.llm_tokens_per_item, self.items_per_sample) <= 0:
            raise PlanError(f"encoder {self.name!r}: token and item counts must be positive")
        self.attention_spans = tuple(self.attention_spans)
        self.deepstack_layers = tuple(self.deepstack_layers)
        if self.attention_spans and sum(self.attention_spans) != self.tokens_per_item:
            raise PlanError(f"encoder {self.name!r}: attention spans "
                            f"{list(self.attention_spans)} must cover its "
                            f"{self.tokens_per_item} tokens per item")
        if any(not 0 <= i < self.transformer.num_layers for i in self.deepstack_layers):
            raise PlanError(f"encoder {self.name!r}: DeepStack layers "
                            f"{list(self.deepstack_layers)} outside its "
                            f"{self.transformer.num_layers} layers")
        if self.projector_input_size is None:
            self.projector_input_size = self.transformer.hidden_size

    @property
    def media_tokens_per_sample(self) -> int:
        return self.items_per_sample * self.llm_tokens_per_item


@dataclass
class ModelSpec(Record):
    """Encoders -> projectors -> LLM, and what is frozen."""

    name: str
    encoders: List[EncoderSpec]
    llm: TransformerSpec
    frozen_encoders: List[str] = field(default_factory=list)
    frozen_projectors: List[str] = field(default_factory=list)
    freeze_llm: bool = False
    # Megatron's default: the output layer reuses the word embedding unless
    # --untie-embeddings-and-output-weights.
    tied_embeddings: bool = True

    def __post_init__(self):
        names = [e.name for e in self.encoders]
        if len(set(names)) != len(names):
            raise PlanError(f"encoder names must be unique, got {names}")
        for what, frozen in (("encoders", self.frozen_encoders),
                             ("projectors", self.frozen_projectors)):
            unknown = sorted(set(frozen) - set(names))
            if unknown:
                raise PlanError(f"frozen {what} {unknown} are not in the model ({names})")
        if self.llm.vocab_size <= 0:
            raise PlanError("the LLM needs a vocabulary size (--vocab-size)")

    @property
    def media_tokens_per_sample(self) -> int:
        return sum(e.media_tokens_per_sample for e in self.encoders)

    def with_freeze(self, encoders: bool, projectors: bool, llm: bool) -> "ModelSpec":
        """The same model with every encoder / projector / the LLM frozen or not."""
        names = [e.name for e in self.encoders]
        return dataclasses.replace(self, frozen_encoders=names if encoders else [],
                                   frozen_projectors=names if projectors else [],
                                   freeze_llm=llm)


@dataclass
class Workload(Record):
    """Per-micro-batch work and the knobs that change per-layer cost."""

    seq_length: int  # LLM tokens per sample, media tokens included (Megatron's --seq-length)
    micro_batch_size: int = 1
    recompute: bool = False  # --recompute-granularity full: every transformer layer
    tensor_model_parallel_size: int = 1  # ideal split of FLOPs, weights and activations
    expert_model_parallel_size: int = 1  # ranks the experts are split over (all-to-alls)
    # Ranks each expert's weights are split over (Megatron's default: the TP size)
    expert_tensor_parallel_size: Optional[int] = None

    def __post_init__(self):
        for name in ("seq_length", "micro_batch_size", "tensor_model_parallel_size",
                     "expert_model_parallel_size"):
            if getattr(self, name) <= 0:
                raise PlanError(f"--{name.replace('_', '-')} must be positive")
        if self.expert_tensor_parallel_size is not None and self.expert_tensor_parallel_size <= 0:
            raise PlanError("--expert-tensor-parallel-size must be positive")

    @property
    def expert_shards(self) -> int:
        """Ranks one MoE layer's routed experts are split over: EP x expert TP."""
        etp = self.expert_tensor_parallel_size or self.tensor_model_parallel_size
        return self.expert_model_parallel_size * etp


def patch_embed_flops(patch: int, hidden: int, channels: int = 3, frames: int = 1) -> float:
    """Forward FLOPs per token of a ViT patch convolution (one matmul per patch)."""
    return 2.0 * channels * frames * patch * patch * hidden


def whisper_stem_flops(mel_bins: int, hidden: int) -> float:
    """Forward FLOPs per encoder frame of Whisper's stem: conv1 (k=3) on the two mel frames
    behind each output frame, then conv2 (k=3, stride 2)."""
    return 2.0 * (2 * 3 * mel_bins * hidden + 3 * hidden * hidden)

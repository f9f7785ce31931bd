"""Model configuration: plain dataclasses that validate themselves.

No torch import here: the planner and the CLI validate a configuration before any process
group exists. Error messages name the command-line flag to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, Optional, Tuple, Union


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which flag to change."""


def require(cond: bool, message: str) -> None:
    """A ``ConfigError`` with ``message`` unless ``cond``."""
    if not cond:
        raise ConfigError(message)


@dataclass
class ProjectorConfig:
    """LLaVA's MLP projector: Linear -> GELU -> Linear, tensor-parallel."""

    projector_type: str = "mlp"
    ffn_hidden_size: Optional[int] = None  # defaults to the LLM's hidden size

    def __post_init__(self):
        require(self.projector_type in ("mlp", "affine"),
                 f"--projector-type must be mlp or affine, got {self.projector_type!r}")


@dataclass
class YarnConfig:
    """YaRN RoPE (``--position-embedding-type yarn``): Megatron-Core's
    ``YarnRotaryEmbedding`` settings by Megatron-LM's flags (the dests), each default
    Megatron-Core's. Attention scales cos / sin by ``mscale``'s concentration factor
    (``0.1 * mscale * ln(factor) + 1`` over the same with ``mscale_all_dim``)."""

    rotary_scaling_factor: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    yarn_correction_range_round_to_int: bool = True

    def __post_init__(self):
        require(self.rotary_scaling_factor > 0,
                 f"--rotary-scaling-factor must be > 0, got {self.rotary_scaling_factor}")
        require(self.yarn_original_max_position_embeddings > 0,
                 "--yarn-original-max-position-embeddings must be > 0, got "
                 f"{self.yarn_original_max_position_embeddings}")

    def transformer_config_attributes(self) -> Dict[str, object]:
        """What Megatron-Core's GPTModel and Attention read off the TransformerConfig (as
        undeclared ``yarn_*`` attributes, set by Megatron-LM's
        ``_apply_yarn_config_from_args``)."""
        return {"yarn_rotary_scaling_factor": self.rotary_scaling_factor,
                "yarn_original_max_position_embeddings":
                    self.yarn_original_max_position_embeddings,
                "yarn_beta_fast": self.yarn_beta_fast, "yarn_beta_slow": self.yarn_beta_slow,
                "yarn_mscale": self.mscale, "yarn_mscale_all_dim": self.mscale_all_dim,
                "yarn_correction_range_round_to_int": self.yarn_correction_range_round_to_int}


@dataclass
class MoEConfig:
    """The LLM's mixture-of-experts layers (Megatron-Core's ``MoELayer``), as Megatron-LM's
    MoE flags describe them. ``layer_freq``: ``--moe-layer-freq``, an int N (layer i is
    sparse when i % N == 0) or one 0/1 per layer (1: MoE, 0: the dense MLP)."""

    num_experts: int
    ffn_hidden_size: int  # each expert's (--moe-ffn-hidden-size)
    router_topk: int = 2
    router_pre_softmax: bool = False  # softmax over all experts, then top-k (no renorm)
    router_load_balancing_type: str = "aux_loss"
    aux_loss_coeff: float = 0.0
    layer_freq: Union[int, Tuple[int, ...]] = 1
    token_dispatcher_type: str = "allgather"
    grouped_gemm: bool = False
    # A shared expert beside the routed ones (Qwen3.5-MoE): its hidden size
    # (--moe-shared-expert-intermediate-size; None: none) and its sigmoid gate
    # (--moe-shared-expert-gate).
    shared_expert_intermediate_size: Optional[int] = None
    shared_expert_gate: bool = False

    def __post_init__(self):
        require(self.num_experts >= 1, f"--num-experts must be positive, got {self.num_experts}")
        require(1 <= self.router_topk <= self.num_experts,
                 f"--moe-router-topk ({self.router_topk}) must be between 1 and --num-experts "
                 f"({self.num_experts})")
        # Megatron-Core's rule: a softmax over one logit has a zero gradient.
        require(self.router_topk > 1 or self.router_pre_softmax
                or self.router_load_balancing_type == "sinkhorn",
                 "--moe-router-topk 1 needs --moe-router-pre-softmax")
        require(self.aux_loss_coeff >= 0,
                 f"--moe-aux-loss-coeff must be >= 0, got {self.aux_loss_coeff}")
        if not isinstance(self.layer_freq, int):
            self.layer_freq = tuple(int(v) for v in self.layer_freq)
        require(self.shared_expert_intermediate_size is None
                or self.shared_expert_intermediate_size > 0,
                 "--moe-shared-expert-intermediate-size must be positive")
        require(not self.shared_expert_gate or self.shared_expert_intermediate_size,
                 "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size")

    def pattern(self, num_layers: int) -> Tuple[int, ...]:
        """One entry per LLM layer: 1 an MoE layer, 0 a dense one."""
        freq = self.layer_freq
        if isinstance(freq, int):
            require(freq >= 1, f"--moe-layer-freq must be >= 1, got {freq}")
            return tuple(int(i % freq == 0) for i in range(num_layers))
        require(len(freq) == num_layers and set(freq) <= {0, 1},
                 f"--moe-layer-freq lists {len(freq)} layers ({list(freq)}); give one 0 "
                 f"(dense) or 1 (MoE) per layer of --num-layers ({num_layers})")
        return freq


@dataclass
class LinearAttentionConfig:
    """The Gated DeltaNet layers of a hybrid LLM (Qwen3.5), Megatron-Core's ``GatedDeltaNet``
    by Megatron-LM's flag names (``--experimental-attention-variant gated_delta_net``).
    ``linear_attention_freq``: ``--linear-attention-freq``, an int N (layer i is full
    attention when (i + 1) % N == 0, linear otherwise: Megatron-LM's rule) or one 0/1 per
    layer (1: linear attention, 0: full attention)."""

    linear_attention_freq: Union[int, Tuple[int, ...]] = 4
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # The chunk length of the chunked delta rule (Megatron-Core's and FLA's: 64).
    chunk_size: int = 64

    def __post_init__(self):
        if not isinstance(self.linear_attention_freq, int):
            self.linear_attention_freq = tuple(int(v) for v in self.linear_attention_freq)
        for name in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_num_key_heads", "linear_num_value_heads", "chunk_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0,
                     f"--{name.replace('_', '-')} must be a positive int, got {value!r}")
        require(self.linear_num_value_heads % self.linear_num_key_heads == 0,
                 f"--linear-num-value-heads ({self.linear_num_value_heads}) must be a "
                 f"multiple of --linear-num-key-heads ({self.linear_num_key_heads})")

    def pattern(self, num_layers: int) -> Tuple[int, ...]:
        freq = self.linear_attention_freq
        if isinstance(freq, int):
            require(freq >= 1, f"--linear-attention-freq must be >= 1, got {freq}")
            return tuple(0 if (i + 1) % freq == 0 else 1 for i in range(num_layers))
        require(len(freq) == num_layers and set(freq) <= {0, 1},
                 f"--linear-attention-freq as a list takes one 0/1 per layer "
                 f"(--num-layers {num_layers}), got {list(freq)}")
        return freq


@dataclass
class LanguageModelConfig:
    """A Llama / Qwen2 style decoder on Megatron-Core's GPTModel."""

    vocab_size: int = 32000
    hidden_size: int = 128
    num_layers: int = 2
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None  # None: multi-head attention
    ffn_hidden_size: Optional[int] = None
    kv_channels: Optional[int] = None  # head dim; None: hidden / heads (Qwen3 differs)
    seq_length: int = 128
    max_position_embeddings: Optional[int] = None
    rotary_base: float = 10000.0
    # "rope", or Qwen2-VL's multimodal RoPE ("mrope"): the rotary frequencies split into
    # temporal, height and width sections (``mrope_section``, counts of frequencies, summing
    # to kv_channels / 2), each rotated by its own row of 3-D position ids [3, B, S].
    # "yarn": YaRN's scaled RoPE (``yarn``'s settings).
    position_embedding_type: str = "rope"
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False  # Qwen3-VL: T H W frequencies in turn, not sections
    # Llama 3.x RoPE scaling (--use-rope-scaling): Megatron-Core's, by --rope-scaling-factor
    # (low / high frequency factors 1 and 4 and an original context of 8192 fixed there).
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    yarn: YarnConfig = field(default_factory=YarnConfig)
    add_qkv_bias: bool = False  # Qwen2
    qk_layernorm: bool = False  # Qwen3
    untie_embeddings_and_output_weights: bool = False  # Megatron default: tied
    norm_epsilon: float = 1e-6
    make_vocab_size_divisible_by: int = 128
    # Set to keep a checkpoint's padded vocabulary when loading it at another TP size.
    padded_vocab_size: Optional[int] = None
    moe: Optional[MoEConfig] = None  # None: every layer's MLP dense
    # Partial rotary (Qwen3.5's full-attention layers rotate a quarter of each head):
    # Megatron-LM's --rotary-percent.
    rotary_percent: float = 1.0
    # Gated attention (Qwen3.5): a sigmoid output gate per head, Megatron-Core's
    # ``attention_output_gate`` (--attention-output-gate).
    attention_output_gate: bool = False
    linear_attention: Optional[LinearAttentionConfig] = None  # None: every layer full attention
    # Norms scaling by 1 + weight (Qwen3.5): Megatron-LM's --apply-layernorm-1p
    # (Megatron-Core's layernorm_zero_centered_gamma).
    apply_layernorm_1p: bool = False

    def __post_init__(self):
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads == 0:
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        require(self.kv_channels is not None,
                 f"--hidden-size ({self.hidden_size}) must be divisible by "
                 f"--num-attention-heads ({self.num_attention_heads}), or pass --kv-channels")
        require(self.num_attention_heads % self.num_query_groups == 0,
                 f"--num-attention-heads ({self.num_attention_heads}) must be divisible by "
                 f"--num-query-groups ({self.num_query_groups})")
        require(self.seq_length <= self.max_position_embeddings,
                 f"--seq-length ({self.seq_length}) exceeds --max-position-embeddings "
                 f"({self.max_position_embeddings})")
        self._validate_position_embedding()
        if self.moe is not None:
            self.moe.pattern(self.num_layers)
        require(0.0 < self.rotary_percent <= 1.0,
                 f"--rotary-percent must be in (0, 1], got {self.rotary_percent}")
        if self.linear_attention is not None:
            self.linear_attention.pattern(self.num_layers)

    def linear_attention_pattern(self) -> Tuple[int, ...]:
        """One entry per layer: 1 a Gated DeltaNet (linear attention) layer, 0 full
        attention; all 0 without ``linear_attention``."""
        if self.linear_attention is None:
            return (0,) * self.num_layers
        return self.linear_attention.pattern(self.num_layers)

    def _validate_position_embedding(self) -> None:
        kind, section = self.position_embedding_type, self.mrope_section
        # learned_absolute / none: Megatron-LM's other GPT positions (its default is
        # learned_absolute), for a GPT built by a Megatron-LM script: the learned table is
        # read at the text tokens' sequence positions, media features replace their
        # placeholders' rows (as Megatron-Core's LLaVAModel merges them)
        require(kind in ("rope", "mrope", "yarn", "learned_absolute", "none"),
                 "--position-embedding-type must be rope, mrope, yarn, learned_absolute or "
                 f"none, got {kind!r}")
        require(not self.rope_scaling or kind == "rope",
                 f"--use-rope-scaling needs --position-embedding-type rope, got {kind}")
        require(self.rope_scaling_factor > 0,
                 f"--rope-scaling-factor must be > 0, got {self.rope_scaling_factor}")
        if kind != "yarn":
            for f in fields(YarnConfig):
                value = getattr(self.yarn, f.name)
                flag = ("--no-" if value is False else "--") + f.name.replace("_", "-")
                require(value == f.default, f"{flag} needs --position-embedding-type yarn")
        if kind != "mrope":
            require(section is None, "--mrope-section needs --position-embedding-type mrope")
            require(not self.mrope_interleaved,
                    "--mrope-interleaved needs --position-embedding-type mrope")
            return
        require(section is not None,
                 "--position-embedding-type mrope needs --mrope-section T H W (rotary "
                 "frequencies of the temporal, height and width positions)")
        self.mrope_section = section = tuple(int(n) for n in section)
        require(len(section) == 3 and min(section) >= 0,
                 f"--mrope-section takes three non-negative ints (temporal, height, width),"
                 f" got {list(section)}")
        rotary = int(self.kv_channels * self.rotary_percent) // 2
        of = "--kv-channels / 2" if self.rotary_percent == 1.0 else \
            "--kv-channels x --rotary-percent / 2"
        require(sum(section) == rotary,
                 f"--mrope-section {' '.join(map(str, section))} sums to {sum(section)}; it "
                 f"must equal {of} ({rotary}: one entry per rotary frequency of a head)")

    @property
    def mrope(self) -> bool:
        return self.position_embedding_type == "mrope"

    def vocab_size_padded(self, tensor_model_parallel_size: int) -> int:
        """Megatron's rule: pad to a multiple of make_vocab_size_divisible_by * TP.

        The padded rows take part in the softmax, so runs compare exactly only at equal
        padded sizes; ``padded_vocab_size`` pins it (checkpoints do, across TP sizes).
        """
        tp = tensor_model_parallel_size
        if self.padded_vocab_size is not None:
            require(self.padded_vocab_size % tp == 0 and self.padded_vocab_size >= self.vocab_size,
                     f"padded vocabulary {self.padded_vocab_size} (from the checkpoint) is not "
                     f"divisible by --tensor-model-parallel-size ({tp})")
            return self.padded_vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


@dataclass
class FreezeConfig:
    """What is frozen. Frozen parameters get no gradient and are not in the optimizer."""

    language_model: bool = False
    encoders: frozenset = frozenset()
    projectors: frozenset = frozenset()

    def __post_init__(self):
        self.encoders = frozenset(self.encoders)
        self.projectors = frozenset(self.projectors)


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (``models/lora.py``): ``targets`` maps a module of the model
    (``language_model``, ``vision_model``, ``vision_projection`` ...) to the Hugging Face
    projections adapted there (q_proj ... down_proj); its other weights are frozen."""

    targets: Tuple[Tuple[str, Tuple[str, ...]], ...]
    rank: int
    alpha: float
    dropout: float = 0.0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank  # PEFT's (not rsLoRA's)

    def modules(self) -> Dict[str, Tuple[str, ...]]:
        return dict(self.targets)


@dataclass
class MultimodalModelConfig:
    """Named encoders (each with its projector) feeding one language model."""

    # name -> an encoder family's config (its ``model_type`` names the family); {}: an LLM
    encoders: Dict[str, object]
    projectors: Dict[str, ProjectorConfig] = field(default_factory=dict)
    language: LanguageModelConfig = field(default_factory=LanguageModelConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)
    lora: Optional[LoraConfig] = None  # --lora-rank: adapters, their modules' base frozen

    def __post_init__(self):
        for name in self.encoders:
            self.projectors.setdefault(name, ProjectorConfig())
        extra = set(self.projectors) - set(self.encoders)
        require(not extra, f"projectors {sorted(extra)} have no encoder")
        for kind, names in (("encoders", self.freeze.encoders),
                            ("projectors", self.freeze.projectors)):
            unknown = set(names) - set(self.encoders)
            require(not unknown, f"frozen {kind} {sorted(unknown)} are not in the model "
                                  f"(it has {sorted(self.encoders)})")
        require(not self.fully_frozen,
                 "every module is frozen (--freeze-LM, --freeze-ViT, --freeze-audio, "
                 "--freeze-projector): "
                 "nothing would train; drop one of these flags")

    @property
    def fully_frozen(self) -> bool:
        return (self.freeze.language_model
                and self.freeze.encoders == set(self.encoders)
                and self.freeze.projectors == set(self.encoders))

    def validate_parallel(self, tensor_model_parallel_size: int,
                          encoder_tensor_model_parallel_size: Optional[int] = None) -> None:
        """Divisibility rules of tensor parallelism, checked before any process starts. The
        encoders' layers split over ``encoder_tensor_model_parallel_size`` (default: the
        LLM's TP); projectors over the LLM's."""
        tp = tensor_model_parallel_size
        etp = encoder_tensor_model_parallel_size or tp
        tp_flag = "--tensor-model-parallel-size"
        etp_flag = tp_flag if etp == tp else "--encoder-tensor-model-parallel-size"
        lm = self.language
        checks = [
            (lm.hidden_size, "--hidden-size", tp, tp_flag),
            (lm.num_attention_heads, "--num-attention-heads", tp, tp_flag),
            (lm.num_query_groups, "--num-query-groups", tp, tp_flag),
            (lm.ffn_hidden_size, "--ffn-hidden-size", tp, tp_flag),
        ]
        for enc in self.encoders.values():
            checks += [(enc.hidden_size, f"{enc.flag_prefix}hidden-size", etp, etp_flag),
                       (enc.num_attention_heads, f"{enc.flag_prefix}num-attention-heads", etp,
                        etp_flag),
                       (enc.ffn_hidden_size, f"{enc.flag_prefix}ffn-hidden-size", etp,
                        etp_flag)]
        for name, proj in self.projectors.items():
            size = proj.ffn_hidden_size or lm.hidden_size
            checks.append((size, "--projector-ffn-hidden-size", tp, tp_flag))
        if lm.linear_attention is not None:  # GDN splits its heads over TP
            la = lm.linear_attention
            checks += [(la.linear_num_key_heads, "--linear-num-key-heads", tp, tp_flag),
                       (la.linear_num_value_heads, "--linear-num-value-heads", tp, tp_flag)]
        for value, flag, size, size_flag in checks:
            require(value % size == 0,
                     f"{flag} ({value}) is not divisible by {size_flag} ({size}); change one "
                     "of them")

"""Model configuration: plain dataclasses that validate themselves.

No torch import here: the planner and the CLI validate a configuration before any process
group exists. Error messages name the command-line flag to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which flag to change."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@dataclass
class VisionEncoderConfig:
    """A ViT: ``clip`` (class token, pre-norm ``ln_pre``, quick-GELU) or ``siglip``.

    ``feature_layer`` follows Hugging Face's ``vision_feature_layer``: index into the
    hidden states, where 0 is the embedding output and k the output of layer k; negative
    counts from the end (-1: last layer, -2: LLaVA-1.5's choice). Only the layers up to the
    feature layer are built, since later ones would never run.
    """

    model_type: str = "clip"
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    ffn_hidden_size: Optional[int] = None
    img_h: int = 28
    img_w: int = 28
    patch_dim: int = 7
    feature_layer: int = -1
    drop_class_token: bool = False  # --disable-vision-class-token drops it (LLaVA does)
    apply_post_layernorm: bool = False  # LLaVA-style models take pre-norm hidden states
    layernorm_epsilon: Optional[float] = None
    flag_prefix: str = "--vision-"

    def __post_init__(self):
        p = self.flag_prefix
        _require(self.model_type in ("clip", "siglip"),
                 f"{p}model-type must be clip or siglip, got {self.model_type!r}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.layernorm_epsilon is None:
            self.layernorm_epsilon = 1e-5 if self.model_type == "clip" else 1e-6
        _require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}hidden-size ({self.hidden_size}) must be divisible by "
                 f"{p}num-attention-heads ({self.num_attention_heads})")
        for name, size in (("--img-h", self.img_h), ("--img-w", self.img_w)):
            _require(size % self.patch_dim == 0,
                     f"{name} ({size}) must be divisible by --patch-dim ({self.patch_dim})")
        _require(1 <= self.num_layers_built <= self.num_layers,
                 f"{p}feature-layer {self.feature_layer} selects no transformer layer of "
                 f"{self.num_layers}; use a value in [1, {self.num_layers}] or "
                 f"[-{self.num_layers}, -1]")

    @property
    def has_class_token(self) -> bool:
        return self.model_type == "clip"

    @property
    def num_patches(self) -> int:
        return (self.img_h // self.patch_dim) * (self.img_w // self.patch_dim)

    @property
    def num_layers_built(self) -> int:
        k = self.feature_layer
        return k if k >= 0 else self.num_layers + 1 + k

    @property
    def num_output_tokens(self) -> int:
        """Tokens per image handed to the projector (the placeholder expansion count)."""
        keep_cls = self.has_class_token and not self.drop_class_token
        return self.num_patches + int(keep_cls)


@dataclass
class AudioEncoderConfig:
    """A Whisper-style encoder: two 1-D convolutions over log-mel frames (the second with
    stride 2), sinusoidal positions, pre-norm transformer layers, a final norm, then an
    optional average pooling of frames (Qwen2-Audio pools by 2).

    Every clip is padded to ``max_frames`` mel frames, as Whisper pads to 30 s, so a clip's
    features do not depend on the batch it is in; only its first ``output_tokens(frames)``
    features reach the LLM.
    """

    model_type: str = "whisper"
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    ffn_hidden_size: Optional[int] = None
    num_mel_bins: int = 80
    max_source_positions: int = 100  # encoder frames after the stride-2 conv (Whisper: 1500)
    pool_stride: int = 1  # average pooling of encoder frames (Qwen2-Audio: 2)
    layernorm_epsilon: float = 1e-5
    flag_prefix: str = "--audio-"

    def __post_init__(self):
        p = self.flag_prefix
        _require(self.model_type == "whisper",
                 f"{p}model-type must be whisper, got {self.model_type!r}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        _require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}hidden-size ({self.hidden_size}) must be divisible by "
                 f"{p}num-attention-heads ({self.num_attention_heads})")
        _require(self.hidden_size % 2 == 0,
                 f"{p}hidden-size ({self.hidden_size}) must be even (sinusoidal positions)")
        _require(self.num_layers >= 1, f"{p}num-layers must be at least 1")
        _require(self.num_mel_bins >= 1, f"{p}num-mel-bins must be positive")
        _require(self.pool_stride >= 1, f"{p}pool-stride must be at least 1")
        _require(self.max_source_positions >= self.pool_stride,
                 f"{p}max-source-positions ({self.max_source_positions}) must be at least "
                 f"{p}pool-stride ({self.pool_stride})")

    @property
    def num_layers_built(self) -> int:
        return self.num_layers

    @property
    def max_frames(self) -> int:
        """Mel frames every clip is padded to (the longest clip the encoder takes)."""
        return 2 * self.max_source_positions

    @property
    def seq_length(self) -> int:
        return self.max_source_positions

    @property
    def num_output_tokens(self) -> int:
        """Features per clip out of the encoder (before dropping a clip's padding)."""
        return self.max_source_positions // self.pool_stride

    def output_tokens(self, frames: int) -> int:
        """Placeholder tokens of a clip of ``frames`` mel frames: the encoder frames its
        audio reaches (stride-2 conv), pooled; at least one."""
        encoder_frames = (frames - 1) // 2 + 1
        return max(1, min(encoder_frames // self.pool_stride, self.num_output_tokens))


@dataclass
class ProjectorConfig:
    """LLaVA's MLP projector: Linear -> GELU -> Linear, tensor-parallel."""

    projector_type: str = "mlp"
    ffn_hidden_size: Optional[int] = None  # defaults to the LLM's hidden size

    def __post_init__(self):
        _require(self.projector_type in ("mlp", "affine"),
                 f"--projector-type must be mlp or affine, got {self.projector_type!r}")


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
    position_embedding_type: str = "rope"
    mrope_section: Optional[Tuple[int, ...]] = None
    add_qkv_bias: bool = False  # Qwen2
    qk_layernorm: bool = False  # Qwen3
    untie_embeddings_and_output_weights: bool = False  # Megatron default: tied
    norm_epsilon: float = 1e-6
    make_vocab_size_divisible_by: int = 128
    # Set to keep a checkpoint's padded vocabulary when loading it at another TP size.
    padded_vocab_size: Optional[int] = None

    def __post_init__(self):
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads == 0:
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        _require(self.kv_channels is not None,
                 f"--hidden-size ({self.hidden_size}) must be divisible by "
                 f"--num-attention-heads ({self.num_attention_heads}), or pass --kv-channels")
        _require(self.num_attention_heads % self.num_query_groups == 0,
                 f"--num-attention-heads ({self.num_attention_heads}) must be divisible by "
                 f"--num-query-groups ({self.num_query_groups})")
        _require(self.seq_length <= self.max_position_embeddings,
                 f"--seq-length ({self.seq_length}) exceeds --max-position-embeddings "
                 f"({self.max_position_embeddings})")
        self._validate_position_embedding()

    def _validate_position_embedding(self) -> None:
        kind, section = self.position_embedding_type, self.mrope_section
        _require(kind in ("rope", "mrope"),
                 f"--position-embedding-type must be rope or mrope, got {kind!r}")
        if kind == "rope":
            _require(section is None, "--mrope-section needs --position-embedding-type mrope")
            return
        _require(section is not None,
                 "--position-embedding-type mrope needs --mrope-section T H W (rotary "
                 "frequencies of the temporal, height and width positions)")
        self.mrope_section = section = tuple(int(n) for n in section)
        _require(len(section) == 3 and min(section) >= 0,
                 f"--mrope-section takes three non-negative ints (temporal, height, width),"
                 f" got {list(section)}")
        _require(sum(section) == self.kv_channels // 2,
                 f"--mrope-section {' '.join(map(str, section))} sums to {sum(section)}; it "
                 f"must equal --kv-channels / 2 ({self.kv_channels // 2}: one entry per "
                 f"rotary frequency of a head)")

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
            _require(self.padded_vocab_size % tp == 0 and self.padded_vocab_size >= self.vocab_size,
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


@dataclass
class MultimodalModelConfig:
    """Named encoders (each with its projector) feeding one language model."""

    encoders: Dict[str, Union[VisionEncoderConfig, AudioEncoderConfig]] = field(
        default_factory=lambda: {"vision": VisionEncoderConfig()})
    projectors: Dict[str, ProjectorConfig] = field(default_factory=dict)
    language: LanguageModelConfig = field(default_factory=LanguageModelConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)

    def __post_init__(self):
        for name in self.encoders:
            self.projectors.setdefault(name, ProjectorConfig())
        extra = set(self.projectors) - set(self.encoders)
        _require(not extra, f"projectors {sorted(extra)} have no encoder")
        for kind, names in (("encoders", self.freeze.encoders),
                            ("projectors", self.freeze.projectors)):
            unknown = set(names) - set(self.encoders)
            _require(not unknown, f"frozen {kind} {sorted(unknown)} are not in the model "
                                  f"(it has {sorted(self.encoders)})")
        _require(not self.fully_frozen,
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
        for value, flag, size, size_flag in checks:
            _require(value % size == 0,
                     f"{flag} ({value}) is not divisible by {size_flag} ({size}); change one "
                     "of them")

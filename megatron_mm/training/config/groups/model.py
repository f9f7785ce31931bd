"""The model group: the LLM, the encoders, their projectors and what trains."""

import argparse
from dataclasses import dataclass, field
from typing import List, Literal, Optional, Union

from ....data.item_tags import TAG_TYPES
from ....families import slot_choices
from ....families.flags import FamilyFlags
from ..lora_args import TARGETS
from ..moe_args import moe_freq_type
from .fields import DERIVED, flag


@dataclass(frozen=True)
class LanguageModelArgs:
    """The language model: its layers, attention, positions and norms (Megatron-LM's flags)."""

    num_layers: int = 2
    hidden_size: int = 128
    ffn_hidden_size: Optional[int] = None
    num_attention_heads: int = 4
    group_query_attention: bool = False
    num_query_groups: int = 1
    kv_channels: Optional[int] = None
    """attention head dimension (default: hidden size / heads)"""
    seq_length: int = 128
    max_position_embeddings: Optional[int] = None
    rotary_base: float = 10000.0
    position_embedding_type: Literal["rope", "mrope", "yarn"] = "rope"
    """mrope: Qwen2-VL's multimodal RoPE, rotating by 3-D (temporal, height, width) position ids;
    yarn: YaRN's scaled RoPE (Megatron-Core's YarnRotaryEmbedding)"""
    mrope_section: Optional[List[int]] = None
    """with mrope: rotary frequencies of the temporal, height and width positions (three ints
    summing to --kv-channels / 2)"""
    mrope_interleaved: bool = False
    """with mrope: deal the rotary frequencies to the temporal, height and width positions in turn
    (Qwen3-VL) instead of in three sections"""
    use_rope_scaling: bool = False
    """Apply rope scaling as used in llama3.x (Megatron-Core's: low / high frequency factors 1 and
    4, original context 8192)"""
    rope_scaling_factor: float = 8.0
    """Rope scaling factor in llama3.x models"""
    rotary_scaling_factor: float = 1.0
    """with yarn: the scaling factor (Hugging Face's rope_parameters factor)"""
    yarn_original_max_position_embeddings: Optional[int] = None
    """Original maximum position embeddings for YaRN RoPE frequency correction (default 4096)"""
    yarn_beta_fast: Optional[float] = None
    """Beta fast for YaRN RoPE frequency correction (default 32)"""
    yarn_beta_slow: Optional[float] = None
    """Beta slow for YaRN RoPE frequency correction (default 1)"""
    mscale: float = 1.0
    """with yarn: scales the concentration factor (0.1 * mscale * ln(factor) + 1) applied to cos /
    sin"""
    mscale_all_dim: float = 0.0
    """with yarn: the concentration factor is divided by 0.1 * mscale_all_dim * ln(factor) + 1"""
    yarn_correction_range_round_to_int: Optional[bool] = flag(
        None, action=argparse.BooleanOptionalAction)
    """Round YaRN correction range endpoints to integers (the default)"""
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    experimental_attention_variant: Optional[Literal["gated_delta_net"]] = None
    """gated_delta_net: Megatron-Core's Gated DeltaNet (linear attention) in the layers
    --linear-attention-freq marks, full attention in the others (Qwen3.5)"""
    linear_attention_freq: Optional[Union[int, List[int]]] = flag(None, type=moe_freq_type)
    """an int N: layer i is full attention when (i + 1) % N == 0, linear otherwise; or one 0/1 per
    layer as a list expression, e.g. "([1]*3+[0])*2" (1: linear, 0: full)"""
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    attention_output_gate: bool = False
    """gated attention: a sigmoid gate per head on the attention output (Qwen3.5's full-attention
    layers)"""
    rotary_percent: float = 1.0
    """the share of each head's dimensions RoPE rotates (Qwen3.5: 0.25)"""
    apply_layernorm_1p: bool = False
    """norms scale by 1 + weight (zero-centred gamma; Qwen3.5)"""
    untie_embeddings_and_output_weights: bool = False
    norm_epsilon: float = 1e-06
    make_vocab_size_divisible_by: int = 128
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    init_method_std: float = 0.02
    transformer_impl: Optional[Literal["local", "transformer_engine"]] = None
    """default: transformer_engine when TE and CUDA are available"""
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto", "flex"] = "auto"
    """the LLM's attention kernel (Megatron-LM's; flex: FlexAttention for every mask); auto: TE for
    causal masks, FlexAttention for the rest on CUDA, the local path elsewhere
    (models/attention_choice.py)"""
    use_cpu_initialization: Optional[bool] = flag(None, action="store_true")
    """build full weights on the CPU then split (TP-independent init; always on without CUDA)"""


@dataclass(frozen=True)
class VisionEncoderArgs:
    """The vision encoder, its input images and its projector (an encoder family's own flags are in
    the family's section)."""

    vision_model_type: str = flag("clip", choices=slot_choices("vision"))
    """the vision encoder's family (megatron_mm.families); none: a language model only"""
    vision_hidden_size: int = 64
    vision_num_layers: int = 2
    vision_num_attention_heads: int = 4
    vision_ffn_hidden_size: Optional[int] = None
    vision_feature_layer: int = -1
    vision_norm_epsilon: Optional[float] = None
    """default: 1e-5 for clip, 1e-6 for siglip"""
    img_h: int = 28
    img_w: int = 28
    patch_dim: int = 7
    disable_vision_class_token: bool = False
    """drop the class token from the encoder output (LLaVA does)"""
    projector_type: Literal["mlp", "affine"] = "mlp"
    projector_ffn_hidden_size: Optional[int] = None
    image_token_id: Optional[int] = None
    """the image placeholder's token id (default: the tokenizer's own, after its vocabulary)"""
    video_token_id: Optional[int] = None
    """the video placeholder's token id (default: the tokenizer's own)"""
    image_tag_type: str = flag("auto", choices=TAG_TYPES)
    """tokens around each image's (and video's) placeholder tokens (Megatron-LM's flag): internvl
    <img> </img>, nvlm <Image> </Image>, qwen-vl <|vision_start|> <|vision_end|>; none (or ""):
    no tags, for records whose text carries them; auto: the encoder family's own (InternVL's,
    Qwen2.5-VL's) where the tokenizer has those tokens. A named style adds tokens a
    SentencePiece vocabulary lacks after it"""
    image_processor_config: Optional[str] = None
    """a Hugging Face preprocessor_config.json (CLIP / SigLIP image processor); default: bicubic
    resize to --img-h with CLIP's mean/std"""


@dataclass(frozen=True)
class AudioEncoderArgs:
    """The audio encoder and its projector."""

    audio_model_type: str = flag("none", choices=slot_choices("audio"))
    """whisper: a Whisper-style encoder (conv stem, sinusoidal positions, pre-norm layers) as the
    "audio" encoder, fed <audio> clips"""
    audio_hidden_size: int = 64
    audio_num_layers: int = 2
    audio_num_attention_heads: int = 4
    audio_ffn_hidden_size: Optional[int] = None
    audio_num_mel_bins: int = 80
    audio_max_source_positions: int = 1500
    """encoder frames after the stride-2 convolution; clips are padded to twice this many 10 ms mel
    frames (Whisper: 1500 = 30 s) and longer clips are refused"""
    audio_pool_stride: int = 1
    """average-pool encoder frames by this factor (Qwen2-Audio: 2)"""
    audio_norm_epsilon: float = 1e-05
    audio_projector_type: Optional[Literal["mlp", "affine"]] = None
    """default: --projector-type"""
    audio_token_id: Optional[int] = None
    """the audio placeholder's token id (default: the tokenizer's own)"""


@dataclass(frozen=True)
class FreezingArgs:
    """What trains: frozen modules and LoRA adapters."""

    freeze_LM: bool = False
    freeze_ViT: bool = False
    freeze_audio: bool = False
    """freeze the audio encoder (its projector: --freeze-projector)"""
    freeze_projector: bool = False
    lora_rank: Optional[int] = None
    """LoRA adapters of this rank on --lora-target-modules (their modules' base weights frozen);
    default: none"""
    lora_alpha: float = 32.0
    """LoRA scaling alpha: the adapters add alpha / rank * B A x"""
    lora_dropout: float = 0.0
    lora_target_modules: List[str] = field(default_factory=lambda: list(TARGETS))
    """[MODULE.]PROJECTION: q_proj ... down_proj or all-linear, in language_model (default),
    vision_model, audio_model, vision_projection or audio_projection"""


@dataclass(frozen=True)
class ModelArgs(FreezingArgs, AudioEncoderArgs, VisionEncoderArgs, LanguageModelArgs):
    """The model group: the language model, the encoders, their projectors, what trains, and
    the encoder families' own flags (``families``)."""

    families: FamilyFlags = field(default_factory=FamilyFlags, metadata=DERIVED)
    """Each encoder family's own flags (``FamilyFlags[Qwen2_5VLFlags]``), from its section."""

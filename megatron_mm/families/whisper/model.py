"""A Whisper-style audio encoder on Megatron-Core's TransformerBlock.

Whisper's encoder (``conv1``, ``conv2``, sinusoidal positions, pre-norm layers, final
``ln_post``), with Qwen2-Audio's optional average pooling of frames before the final norm.
Parameter names follow the ViT (``families/vit/model.py``) so both encoders checkpoint, split
over pipeline stages and convert the same way. The convolutions are small and replicated
across tensor-parallel ranks, like the ViT's patch convolution; the layers are Megatron's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.encoder_parts import EncoderParts
from ...models.interleaved_blocks import encoder_block
from .config import AudioEncoderConfig
from .transformer_config import audio_transformer_config


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed position table [length, channels]: sin half, then cos half."""
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-step * torch.arange(channels // 2, dtype=torch.float32))
    scaled = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class AudioEncoder(EncoderParts, MegatronModule):
    """The encoder, or the part one pipeline chunk holds: the convolution stem and positions
    (``embed``), a range of transformer layers (``build_layers``), and pooling plus the
    output norm (``post``)."""

    def __init__(self, config: TransformerConfig, encoder: AudioEncoderConfig,
                 layer_spec: ModuleSpec, norm_impl: type, embed: bool = True,
                 build_layers: bool = True, post: bool = True, vp_stage=None,
                 pg_collection=None, checkpoint_dp_group=None):
        super().__init__(config=config)
        self.use_encoder_groups(pg_collection, checkpoint_dp_group)
        self.encoder_config = encoder
        hidden = encoder.hidden_size
        self.seq_length = encoder.seq_length
        self.has_embed = embed
        if embed:
            dtype = config.params_dtype
            self.conv1 = torch.nn.Conv1d(encoder.num_mel_bins, hidden, kernel_size=3,
                                         padding=1, dtype=dtype)
            self.conv2 = torch.nn.Conv1d(hidden, hidden, kernel_size=3, stride=2, padding=1,
                                         dtype=dtype)
            # Not learned (Whisper's are frozen): a buffer, but checkpointed and converted,
            # since a checkpoint's table need not be exactly these sinusoids.
            self.register_buffer("position_embeddings",
                                 sinusoids(self.seq_length, hidden).to(dtype))
        self.decoder = (encoder_block(config, layer_spec, vp_stage, pg_collection)
                        if build_layers else None)
        self.has_post = post
        self.ln_post = (build_module(norm_impl, config=config, hidden_size=hidden,
                                     eps=config.layernorm_epsilon) if post else None)

    def embed(self, mels: torch.Tensor) -> torch.Tensor:
        """[N, mel bins, 2 * max_source_positions] log-mel -> [T, N, hidden]."""
        enc = self.encoder_config
        if mels.shape[1:] != (enc.num_mel_bins, enc.max_frames):
            raise ValueError(f"audio features must be [N, {enc.num_mel_bins}, {enc.max_frames}] "
                             f"(mel bins, padded frames), got {list(mels.shape)}")
        x = F.gelu(self.conv1(mels.to(self.conv1.weight.dtype)))
        x = F.gelu(self.conv2(x))  # [N, hidden, T]
        x = x.transpose(1, 2) + self.position_embeddings.unsqueeze(0)
        return self.to_sequence_parallel(x.transpose(0, 1)).contiguous()

    def shard_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, N, hidden] (or this rank's shard of it, a whole number of pooling windows)
        -> [T // pool_stride, N, hidden]: pooled, then normed (Qwen2-Audio's order; without
        pooling it is Whisper's final norm)."""
        x = hidden.transpose(0, 1)
        stride = self.encoder_config.pool_stride
        if stride > 1:
            x = F.avg_pool1d(x.transpose(1, 2), stride, stride).transpose(1, 2)
        return self.ln_post(x).transpose(0, 1)

    def select_output_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return x  # every pooled frame is an output token

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, N, hidden] -> [N, T // pool_stride, hidden]."""
        return self.shard_features(hidden).transpose(0, 1).contiguous()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """The whole encoder: [N, mel bins, frames] -> [N, T', hidden] features."""
        return self.features(self.layers(self.embed(mels)))


def build_audio_encoder(enc: AudioEncoderConfig, settings, specs, part, name: str,
                        vp_stage=None, pg_collection=None,
                        checkpoint_dp_group=None) -> AudioEncoder:
    """The Whisper family's builder (``families/whisper/encoder.py``). Pre-norm LayerNorm layers
    without a mask, as the ViT's: the same layer spec."""
    return AudioEncoder(
        audio_transformer_config(enc, settings, name), enc, specs.vision_layer,
        specs.vision_norm, embed=part.embed, build_layers=part.num_layers > 0,
        post=part.projector, vp_stage=vp_stage, pg_collection=pg_collection,
        checkpoint_dp_group=checkpoint_dp_group)

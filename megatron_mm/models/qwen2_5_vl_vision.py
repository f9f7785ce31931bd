"""Qwen2.5-VL's vision encoder on Megatron-Core layers (tensor-parallel).

- Patch embedding: Hugging Face's Conv3d has kernel = stride = the whole patch (2 frames x
  14 x 14 pixels x 3 channels), so it is a linear map of the flattened patch
  (``patch_embed``, no bias; the converter reshapes the kernel).
- Transformer blocks: Megatron-Core ``TransformerLayer`` with ``SelfAttention`` and a
  SwiGLU ``MLP`` (column / row parallel linears), RMSNorm, biases, 2-D rotary positions:
  half of each head's rotary angles follow the patch row, half its column
  (Hugging Face's ``VisionRotaryEmbedding``), applied by Megatron-Core's rotary code.
- Window attention: all items' patches run as one sequence (no padding), permuted so each
  window is contiguous (``qwen2_5_vl_grid``); window layers attend within a window, the
  ``fullatt_block_indexes`` layers within a frame. On the local path that is one
  block-diagonal mask per kind, built on the host from the grids and stacked into one
  tensor; each layer's core attention picks its own (its kind comes from the spec, by
  global layer number).
- Output: ``ln_post`` (the merger's ``ln_q``) per patch, the 2x2 units side by side
  ([units, 4 x hidden]), back in the processor's order. The merger's MLP is the projector,
  a Megatron-Core ``MultimodalProjector`` (``Qwen2_5VLVisionWithMerger`` holds both, named
  as the multimodal model names its encoder and projector).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import FrozenSet, Optional

import torch
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from ..config import ConfigError
from .norms import SequenceParallelNorm
from .qwen2_5_vl_grid import VisionGridLayout, block_diagonal_mask, vision_grid_layout
from .qwen2_5_vl_vision_config import Qwen2_5VLVisionConfig
from .te_names import with_te_checkpoint_names


WINDOW, FULL = 0, 1  # the two masks of a batch, stacked: [2, 1, N, N]


def stacked_masks(window: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """[2, 1, N, N] bool (True = masked): the window layers' mask, then the full layers'.
    One tensor travels as ``attention_mask`` (Megatron-Core hands it to every layer's core
    attention as is, and activation recomputation can save it)."""
    return torch.cat([window, full], dim=0)


class WindowedDotProductAttention(DotProductAttention):
    """Megatron-Core's local attention with the mask of this layer's kind.
    ``full_attention_layers``: 0-based layer indices that attend over the whole frame."""

    def __init__(self, *args, full_attention_layers: FrozenSet[int] = frozenset(), **kwargs):
        super().__init__(*args, **kwargs)
        # layer_number: Megatron-Core's, 1-based and global (pipeline offsets added).
        self.full_attention = self.layer_number - 1 in full_attention_layers

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if attention_mask is None or attention_mask.shape[0] != 2:
            raise ValueError("the Qwen2.5-VL vision attention takes the stacked [2, 1, N, N] "
                             "window / full masks (stacked_masks)")
        attention_mask = attention_mask[FULL if self.full_attention else WINDOW][None]
        return super().forward(query, key, value, attention_mask, attn_mask_type,
                               attention_bias=attention_bias,
                               packed_seq_params=packed_seq_params)


def qwen2_5_vl_vision_layer_spec(encoder: Qwen2_5VLVisionConfig,
                                 transformer_impl: str = "local") -> ModuleSpec:
    """The ViT block's spec. Checkpoint keys are TE's (``te_names.py``)."""
    if transformer_impl == "transformer_engine":
        # TODO: TE's THD route: TEDotProductAttention with PackedSeqParams (qkv_format
        # "thd", cu_seqlens of windows / frames from the grid layout, per layer kind) and
        # TELayerNormColumnParallelLinear, so no N x N mask is built on the GPU.
        raise ConfigError(
            "the Qwen2.5-VL vision encoder is not wired for --transformer-impl "
            "transformer_engine yet (its variable-length attention needs TE's THD path); "
            "use --transformer-impl local")
    if transformer_impl != "local":
        raise ConfigError(f"--transformer-impl must be local or transformer_engine, got "
                          f"{transformer_impl!r}")
    return with_te_checkpoint_names(ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=SequenceParallelNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear,
                    core_attention=ModuleSpec(
                        module=WindowedDotProductAttention,
                        params={"full_attention_layers":
                                frozenset(encoder.fullatt_block_indexes)}),
                    linear_proj=RowParallelLinear,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=SequenceParallelNorm,
            mlp=partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(
                linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)),
            mlp_bda=get_bias_dropout_add,
        ),
    ))


def merger_submodules(transformer_impl: str = "local") -> MLPSubmodules:
    """The merger MLP's linears (plain column / row parallel: its norm runs per patch,
    before the 2x2 units are put side by side, so it cannot fuse into ``linear_fc1``)."""
    if transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TERowParallelLinear,
        )

        return MLPSubmodules(linear_fc1=TEColumnParallelLinear,
                             linear_fc2=TERowParallelLinear)
    return MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)


class Qwen2_5VisionRotaryEmbedding(torch.nn.Module):
    """Angles of the 2-D RoPE: [N, 1, 1, head_dim] from (row, col) per patch, laid out as
    Hugging Face's (row freqs, col freqs, row freqs, col freqs) for Megatron-Core's
    non-interleaved rotation (``rotate_half``)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        spatial = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions[..., None].float() * self.inv_freq  # [N, 2, head_dim / 4]
        freqs = freqs.flatten(1)  # [N, head_dim / 2]: rows, then cols
        return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]


class Qwen2_5VisionTransformer(MegatronModule):
    """Patches [N, 1176] of items with grids (t, h, w) -> merged features
    [N / 4, 4 x hidden] (before the merger MLP), in the processor's merge-unit order."""

    def __init__(self, config: TransformerConfig, encoder: Qwen2_5VLVisionConfig,
                 layer_spec: Optional[ModuleSpec] = None, vp_stage=None, pg_collection=None):
        super().__init__(config=config)
        self.encoder_config = encoder
        self.patch_embed = torch.nn.Linear(encoder.patch_input_size, encoder.hidden_size,
                                           bias=False, dtype=config.params_dtype)
        config.init_method(self.patch_embed.weight)
        self.rotary = Qwen2_5VisionRotaryEmbedding(encoder.head_dim, encoder.rope_theta)
        self.decoder = TransformerBlock(
            config=config, spec=layer_spec or qwen2_5_vl_vision_layer_spec(encoder),
            pre_process=True, post_process=False, vp_stage=vp_stage,
            pg_collection=pg_collection)
        self.ln_post = SequenceParallelNorm(config=config, hidden_size=encoder.hidden_size,
                                        eps=encoder.norm_epsilon)

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        self.decoder.set_input_tensor(input_tensor)

    def prepare(self, grid_thw, device=None) -> "PreparedVisionBatch":
        """Everything the forward needs from the grids, built on the host and copied to
        ``device`` once: run it with the batch preparation, outside the step's model code
        (the forward then reads no value back from the device)."""
        e = self.encoder_config
        layout = vision_grid_layout(grid_thw, e.spatial_merge_size, e.window_size,
                                    e.patch_size)
        device = device or self.patch_embed.weight.device

        def to_device(t):
            return t.to(device, non_blocking=True)

        return PreparedVisionBatch(
            layout=layout,
            window_index=to_device(layout.window_index),
            reverse_index=to_device(layout.reverse_index),
            positions=to_device(layout.positions),
            masks=to_device(stacked_masks(block_diagonal_mask(layout.window_seqlens),
                                          block_diagonal_mask(layout.frame_seqlens))))

    def _units(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Rows of [N, ...] taken by merge unit (4 consecutive patches) in ``index`` order."""
        unit = self.encoder_config.spatial_merge_size ** 2
        return x.reshape(-1, unit, *x.shape[1:])[index].reshape(x.shape)

    def forward(self, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
        """``pixel_values`` [N, 1176] as Qwen2-VL's processor gives them (all items of the
        batch concatenated); ``grid_thw``: a ``PreparedVisionBatch`` (``prepare``), or the
        host grids (a list of (t, h, w) or a CPU tensor), prepared here."""
        batch = (grid_thw if isinstance(grid_thw, PreparedVisionBatch)
                 else self.prepare(grid_thw, pixel_values.device))
        expected = (batch.layout.num_patches, self.encoder_config.patch_input_size)
        if tuple(pixel_values.shape) != expected:
            raise ValueError(f"pixel_values has shape {tuple(pixel_values.shape)}; grids "
                             f"{batch.layout.grids} need {expected}")
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))
        x = self._units(x, batch.window_index)  # windows contiguous
        hidden = self.decoder(x.unsqueeze(1), attention_mask=batch.masks,
                              rotary_pos_emb=self.rotary(batch.positions))  # [N, 1, hidden]
        hidden = self.ln_post(hidden.squeeze(1))
        merged = hidden.reshape(-1, self.encoder_config.merged_size)
        return merged[batch.reverse_index]


@dataclass
class PreparedVisionBatch:
    """A batch's grid layout (host) and its index tensors and masks (on the device)."""

    layout: VisionGridLayout
    window_index: torch.Tensor
    reverse_index: torch.Tensor
    positions: torch.Tensor
    masks: torch.Tensor  # [2, 1, N, N] (stacked_masks)


class Qwen2_5VLVisionWithMerger(MegatronModule):
    """The vision tower and the merger MLP: patches -> [N / 4, out_hidden_size] tokens for
    the LLM (what Hugging Face's ``Qwen2_5_VisionTransformerPretrainedModel`` returns as
    ``pooler_output``)."""

    def __init__(self, vision_config: TransformerConfig, merger_config: TransformerConfig,
                 encoder: Qwen2_5VLVisionConfig, transformer_impl: str = "local"):
        super().__init__(config=vision_config)
        self.vision_model = Qwen2_5VisionTransformer(
            vision_config, encoder, qwen2_5_vl_vision_layer_spec(encoder, transformer_impl))
        self.vision_projection = MultimodalProjector(
            merger_config, merger_submodules(transformer_impl), "mlp", encoder.merged_size)

    def prepare(self, grid_thw, device=None) -> PreparedVisionBatch:
        return self.vision_model.prepare(grid_thw, device)

    def forward(self, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
        """``grid_thw``: as ``Qwen2_5VisionTransformer.forward`` takes it."""
        return self.vision_projection(self.vision_model(pixel_values, grid_thw))

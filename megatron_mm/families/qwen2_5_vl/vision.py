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
  ``fullatt_block_indexes`` layers within a frame. The segments come from the grids on
  the host (``qwen2_5_vl_attention``): on the local path one block-diagonal mask per
  kind, stacked into one tensor; on Transformer Engine TE's THD varlen attention with
  ``PackedSeqParams`` per kind. Each layer's core attention picks its own kind (from the
  spec, by global layer number).
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
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from ...config import ConfigError
from ...models.host_copy import to_device
from ...models.norms import SequenceParallelNorm
from ...models.specs import transformer_engine_importable
from ...models.te_names import with_te_checkpoint_names
from .attention import FULL, WINDOW, PreparedAttention
from .grid import VisionGridLayout, vision_grid_layout
from .transformer_config import Qwen2_5VLVisionConfig


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
                             "window / full masks (PreparedAttention.layer_inputs)")
        attention_mask = attention_mask[FULL if self.full_attention else WINDOW][None]
        return super().forward(query, key, value, attention_mask, attn_mask_type,
                               attention_bias=attention_bias,
                               packed_seq_params=packed_seq_params)


def qwen2_5_vl_vision_layer_spec(encoder: Qwen2_5VLVisionConfig,
                                 transformer_impl: str = "local") -> ModuleSpec:
    """The ViT block's spec. Checkpoint keys are TE's (``te_names.py``) on either path.
    Local: masks per layer kind (``WindowedDotProductAttention``). Transformer Engine:
    TE's fused norm + linears and its THD varlen attention, each layer handed its kind's
    segments (``qwen2_5_vl_attention``)."""
    full = frozenset(encoder.fullatt_block_indexes)
    if transformer_impl == "transformer_engine":
        if not transformer_engine_importable():
            raise ConfigError("--transformer-impl transformer_engine needs Transformer "
                              "Engine, which is not installed: use --transformer-impl local")
        from megatron.core.extensions.transformer_engine import (
            TELayerNormColumnParallelLinear,
            TERowParallelLinear,
        )

        from .attention import te_segmented_attention

        # The pre-norms fuse into the linears after them (TE's names: te_names.py).
        return vision_layer_spec(IdentityOp, TELayerNormColumnParallelLinear,
                                 TERowParallelLinear, te_segmented_attention(), full)
    if transformer_impl != "local":
        raise ConfigError(f"--transformer-impl must be local or transformer_engine, got "
                          f"{transformer_impl!r}")
    return with_te_checkpoint_names(vision_layer_spec(
        SequenceParallelNorm, ColumnParallelLinear, RowParallelLinear,
        WindowedDotProductAttention, full))


def vision_layer_spec(norm, column_linear, row_linear, core_attention: type,
                      full_attention_layers: FrozenSet[int]) -> ModuleSpec:
    """A tower layer from its parts: pre-norms, linears and the core attention (which
    takes ``full_attention_layers``)."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=column_linear,
                    core_attention=ModuleSpec(
                        module=core_attention,
                        params={"full_attention_layers": full_attention_layers}),
                    linear_proj=row_linear,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(
                linear_fc1=column_linear, linear_fc2=row_linear)),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def merger_submodules(transformer_impl: str = "local") -> MLPSubmodules:
    """The merger MLP's linears (plain column / row parallel: its norm runs per patch,
    before the 2x2 units are put side by side, so it cannot fuse into ``linear_fc1``)."""
    if transformer_impl == "transformer_engine":
        if not transformer_engine_importable():
            raise ConfigError("--transformer-impl transformer_engine needs Transformer "
                              "Engine, which is not installed: use --transformer-impl local")
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
        self.thd = uses_thd_attention(self.decoder)

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        self.decoder.set_input_tensor(input_tensor)

    def prepare(self, grid_thw, device=None) -> "PreparedVisionBatch":
        """Everything the forward needs from the grids, built on the host and copied to
        ``device`` once: run it with the batch preparation, outside the step's model code
        (the forward then reads no value back from the device)."""
        e = self.encoder_config
        layout = vision_grid_layout(grid_thw, e.spatial_merge_size, e.window_size,
                                    e.patch_size)
        return prepare_vision_batch(layout).to(device or self.patch_embed.weight.device)

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
        hidden = self.decoder(x.unsqueeze(1), rotary_pos_emb=self.rotary(batch.positions),
                              **batch.attention.layer_inputs(self.thd))  # [N, 1, hidden]
        hidden = self.ln_post(hidden.squeeze(1))
        merged = hidden.reshape(-1, self.encoder_config.merged_size)
        return merged[batch.reverse_index]


@dataclass
class PreparedVisionBatch:
    """A batch's grid layout (host), its index tensors, rotary positions and attention
    segments (``PreparedAttention``), on the host until ``to``."""

    layout: VisionGridLayout
    window_index: torch.Tensor
    reverse_index: torch.Tensor
    positions: torch.Tensor
    attention: PreparedAttention

    def to(self, device) -> "PreparedVisionBatch":
        move = partial(to_device, device=device)
        return PreparedVisionBatch(self.layout, move(self.window_index),
                                   move(self.reverse_index), move(self.positions),
                                   self.attention.to(device))


def prepare_vision_batch(layout: VisionGridLayout) -> PreparedVisionBatch:
    """Everything the tower needs from a grid layout, on the host."""
    return PreparedVisionBatch(layout, layout.window_index, layout.reverse_index,
                               layout.positions, PreparedAttention.from_seqlens(
                                   layout.window_seqlens, layout.frame_seqlens))


def uses_thd_attention(block) -> bool:
    """Whether ``block``'s layers attend through THD segments (the TE spec)."""
    from .attention import SegmentedAttention

    return any(isinstance(layer.self_attention.core_attention, SegmentedAttention)
               for layer in block.layers)


class Qwen2_5VLVisionWithMerger(MegatronModule):
    """The vision tower and the merger MLP: patches -> [N / 4, out_hidden_size] tokens for
    the LLM (what Hugging Face's ``Qwen2_5_VisionTransformerPretrainedModel`` returns as
    ``pooler_output``)."""

    def __init__(self, vision_config: TransformerConfig, merger_config: TransformerConfig,
                 encoder: Qwen2_5VLVisionConfig, transformer_impl: str = "local",
                 layer_spec: Optional[ModuleSpec] = None):
        super().__init__(config=vision_config)
        self.vision_model = Qwen2_5VisionTransformer(
            vision_config, encoder,
            layer_spec or qwen2_5_vl_vision_layer_spec(encoder, transformer_impl))
        self.vision_projection = MultimodalProjector(
            merger_config, merger_submodules(transformer_impl), "mlp", encoder.merged_size)

    def prepare(self, grid_thw, device=None) -> PreparedVisionBatch:
        return self.vision_model.prepare(grid_thw, device)

    def forward(self, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
        """``grid_thw``: as ``Qwen2_5VisionTransformer.forward`` takes it."""
        return self.vision_projection(self.vision_model(pixel_values, grid_thw))

"""The Qwen3-VL family's encoder module in parts (``families/qwen3_vl/encoder.py``) and
its projector: the final patch merger and the DeepStack mergers.

The tower is Qwen2.5-VL's module (``families/qwen2_5_vl/model.py``: packed items, host
layout bound per batch, 2-D rotary positions, ``ln_post`` + 2x2 merge) with what Qwen3-VL
changes:

- the patch embedding has a bias, and adds the learned position table resampled to each
  grid (``position_table.py``: rows and weights from the host);
- every layer attends within a frame: the layout is Qwen2.5-VL's with one window per
  frame (its window permutation is then the identity), so the local path and Transformer
  Engine's THD path take the same per-frame segments, and no P x P mask is built on the
  host;
- LayerNorm and a tanh-GELU MLP with biases (``transformer_config.py``);
- DeepStack: the outputs of the ``deepstack_visual_indexes`` layers are kept as the
  layers run (forward hooks) and, in the merge, each goes through its own merger (the 2x2
  unit side by side, LayerNorm over it, MLP) to the LLM's width
  (``deepstack_features``); ``models/deepstack.py`` adds them inside the LLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.transformer.module import MegatronModule

from ...config import ConfigError
from ...models.host_copy import to_device
from ...models.norms import SequenceParallelNorm
from ..qwen2_5_vl.encoder import item_grids
from ..qwen2_5_vl.grid import vision_grid_layout
from ..qwen2_5_vl.model import Qwen2_5VLEncoder
from ..qwen2_5_vl.vision import (PreparedVisionBatch, merger_submodules,
                                 prepare_vision_batch, qwen2_5_vl_vision_layer_spec)
from .config import Qwen3VLVisionConfig
from .position_table import position_taps
from .transformer_config import (qwen3_vl_merger_transformer_config,
                                 qwen3_vl_vision_transformer_config)


@dataclass
class Qwen3VisionBatch:
    """One batch's tower layout (Qwen2.5-VL's, one window per frame) and the position
    table's rows and weights per patch; on the host until ``to``."""

    vision: PreparedVisionBatch
    table_index: torch.Tensor  # [patches, 4] long
    table_weight: torch.Tensor  # [patches, 4] float32

    def to(self, device) -> "Qwen3VisionBatch":
        return Qwen3VisionBatch(self.vision.to(device), to_device(self.table_index, device),
                                to_device(self.table_weight, device))


def prepare_batch(enc: Qwen3VLVisionConfig, media: dict) -> Optional[Qwen3VisionBatch]:
    """The family's ``prepare_batch``: from the host media's grids (None: no items)."""
    grids = item_grids(media)
    if not grids:
        return None
    m = enc.spatial_merge_size
    # A window as large as the largest frame: every window is one whole frame.
    frame = enc.patch_size * m * max(max(h, w) for _, h, w in grids)
    layout = vision_grid_layout(grids, m, frame, enc.patch_size)
    index, weight = position_taps(grids, enc.position_side, m)
    return Qwen3VisionBatch(prepare_vision_batch(layout), index, weight)


def vision_layer_spec(enc: Qwen3VLVisionConfig, transformer_impl: str):
    """Qwen2.5-VL's tower layer, every layer a full-attention (whole frame) one; the norm
    and MLP kinds come from the ``TransformerConfig``."""
    return qwen2_5_vl_vision_layer_spec(_EveryLayerFull(tuple(range(enc.num_layers))),
                                        transformer_impl)


@dataclass(frozen=True)
class _EveryLayerFull:
    """What ``qwen2_5_vl_vision_layer_spec`` reads of a config."""

    fullatt_block_indexes: tuple


class Qwen3VLEncoder(Qwen2_5VLEncoder):
    """The vision tower, or the part of it one pipeline chunk holds."""

    def __init__(self, config, encoder: Qwen3VLVisionConfig, layer_spec, embed: bool = True,
                 build_layers: bool = True, post: bool = True, vp_stage=None,
                 pg_collection=None, checkpoint_dp_group=None):
        super().__init__(config, encoder, layer_spec, embed=False, build_layers=build_layers,
                         post=post, vp_stage=vp_stage, pg_collection=pg_collection,
                         checkpoint_dp_group=checkpoint_dp_group)
        self.has_embed = embed
        self.table = None  # the bound batch's position-table rows and weights
        if embed:
            self.patch_embed = torch.nn.Linear(encoder.patch_input_size, encoder.hidden_size,
                                               bias=True, dtype=config.params_dtype)
            config.init_method(self.patch_embed.weight)
            torch.nn.init.zeros_(self.patch_embed.bias)
            self.pos_embed = torch.nn.Embedding(encoder.num_position_embeddings,
                                                encoder.hidden_size, dtype=config.params_dtype)
            config.init_method(self.pos_embed.weight)
        # DeepStack: the outputs of these layers (global indices), kept as they run.
        self.kept: Dict[int, torch.Tensor] = {}
        for layer in (self.decoder.layers if self.decoder is not None else ()):
            if layer.layer_number - 1 in encoder.deepstack_visual_indexes:
                layer.register_forward_hook(self._keep(layer.layer_number - 1))

    def _keep(self, index: int):
        def keep(module, args, output):
            self.kept[index] = output[0]
        return keep

    def bind_batch(self, batch: Optional[Qwen3VisionBatch]) -> None:
        super().bind_batch(None if batch is None else batch.vision)
        self.table = None if batch is None else (batch.table_index, batch.table_weight)
        self.kept = {}

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        """[patches, C*T*P*P] rows -> [patches, 1, hidden]: patch embedding plus the
        position table at each patch's place in its grid."""
        batch = self._batch()
        if pixels.shape[0] != batch.layout.num_patches:
            raise ValueError(f"{pixels.shape[0]} patch rows; the batch's grids need "
                             f"{batch.layout.num_patches}")
        index, weight = self.table
        x = self.patch_embed(pixels.to(self.patch_embed.weight.dtype))
        positions = (self.pos_embed(index) * weight[:, :, None]).sum(1)
        x = x + positions.to(x.dtype)
        # the identity permutation; under sequence parallelism padded and this rank's shard
        return self.to_sequence_parallel(self._units(x, batch.window_index).unsqueeze(1))

    def deepstack_features(self, projector: "Qwen3VLMergers") -> List[torch.Tensor]:
        """Each DeepStack layer's output through its merger: [LLM tokens, out] per layer,
        in the processor's order (the final merger's)."""
        enc = self.encoder_config
        return [self.merge_units(merger, self.kept[index], self.sequence_parallel_group)
                for merger, index in zip(projector.deepstack, enc.deepstack_visual_indexes)]

    def carry(self) -> List[torch.Tensor]:
        """What travels with the hidden state past a pipeline cut inside the tower: the
        DeepStack layers' outputs kept so far (computed here or received), in layer order,
        each the hidden state's shape."""
        return [self.kept[i] for i in sorted(self.kept)]

    def carried(self, first: Optional[int]) -> List[int]:
        """The DeepStack layers before this chunk's first tower layer (``first``; None: it
        holds none, only the mergers): the outputs an earlier chunk carries here."""
        return [i for i in sorted(self.encoder_config.deepstack_visual_indexes)
                if first is None or i < first]

    def receive(self, carried: List[torch.Tensor], first: Optional[int]) -> None:
        """Keep the outputs ``carry`` sent from the chunk before (``carried`` layers)."""
        self.kept.update(zip(self.carried(first), carried))


class DeepStackMerger(MegatronModule):
    """A DeepStack merger: LayerNorm over the 2x2 unit side by side, then the MLP."""

    def __init__(self, config, submodules, merged_size: int, eps: float):
        super().__init__(config=config)
        self.norm = SequenceParallelNorm(config=config, hidden_size=merged_size, eps=eps)
        self.merger = MultimodalProjector(config, submodules, "mlp", merged_size)

    def forward(self, merged: torch.Tensor) -> torch.Tensor:
        return self.merger(self.norm(merged))


class Qwen3VLMergers(MultimodalProjector):
    """The family's projector: the final merger's MLP (its norm is the tower's
    ``ln_post``, before the 2x2 units are put side by side), and the DeepStack mergers
    (``deepstack``, one per ``deepstack_visual_indexes`` layer)."""

    def __init__(self, config, submodules, enc: Qwen3VLVisionConfig):
        super().__init__(config, submodules, "mlp", enc.merged_size)
        self.deepstack = DeepStackMergers(config, [
            DeepStackMerger(config, submodules, enc.merged_size, enc.norm_epsilon)
            for _ in enc.deepstack_visual_indexes])


class DeepStackMergers(MegatronModule):
    """The DeepStack mergers in order, named 0, 1, ... A ``MegatronModule`` rather than a
    ``ModuleList``: Megatron-Core's distributed checkpoint asks a MegatronModule child for
    its own sharded state (the MLPs' TP shards) and saves any other child replicated."""

    def __init__(self, config, mergers):
        super().__init__(config=config)
        for j, merger in enumerate(mergers):
            self.add_module(str(j), merger)

    def __iter__(self):
        return iter(self.children())


def build_qwen3_vl_encoder(enc: Qwen3VLVisionConfig, settings, specs, part, name: str,
                           vp_stage=None, pg_collection=None,
                           checkpoint_dp_group=None) -> Qwen3VLEncoder:
    """The family's builder: the part of the tower the chunk's ``part`` holds."""
    return Qwen3VLEncoder(
        qwen3_vl_vision_transformer_config(enc, settings, name), enc,
        vision_layer_spec(enc, specs.impl), embed=part.embed,
        build_layers=part.num_layers > 0, post=part.projector, vp_stage=vp_stage,
        pg_collection=pg_collection, checkpoint_dp_group=checkpoint_dp_group)


def build_mergers(enc: Qwen3VLVisionConfig, proj, lm, settings, specs,
                  name: str) -> Qwen3VLMergers:
    """The family's projector: the final and DeepStack mergers (merged width -> LLM)."""
    if enc.out_hidden_size != lm.hidden_size:
        raise ConfigError(f"the {name} mergers output {enc.out_hidden_size} features but the "
                          f"LLM's --hidden-size is {lm.hidden_size}")
    return Qwen3VLMergers(qwen3_vl_merger_transformer_config(enc, settings, name),
                          merger_submodules(specs.impl), enc)

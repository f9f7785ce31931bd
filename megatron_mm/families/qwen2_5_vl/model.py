"""The Qwen2.5-VL family's encoder module (``families/qwen2_5_vl/encoder.py``) in parts, as the
multimodal model runs encoders: ``embed`` (patch embedding, window permutation), the
transformer layers this pipeline chunk holds, ``features`` (``ln_post``, 2x2 merge, back
in the processor's order) and the merger MLP as the projector.

A batch's items (images, then videos) run as one packed sequence [patches, 1, hidden]; its
attention segments (window / frame masks, or TE's THD params), rotary positions and
permutations come from the items' grids, built on the host with the batch layout
(``prepare_batch``) and bound before the encoder runs (``bind_batch``), so the forward
reads nothing back from the device. Parameter names are
``Qwen2_5VisionTransformer``'s (its Hugging Face table applies unchanged).
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.transformer.module import MegatronModule

from ...config import ConfigError
from ...models import sequence_parallel
from ...models.encoder_parts import EncoderParts
from ...models.interleaved_blocks import encoder_block
from ...models.norms import SequenceParallelNorm
from .config import Qwen2_5VLVisionConfig
from .encoder import IMAGE, IMAGE_GRID, SECONDS, VIDEO, VIDEO_GRID, item_grids
from .grid import vision_grid_layout
from .transformer_config import (
    qwen2_5_vl_merger_transformer_config,
    qwen2_5_vl_vision_transformer_config,
)
from .vision import (
    PreparedVisionBatch,
    Qwen2_5VisionRotaryEmbedding,
    merger_submodules,
    prepare_vision_batch,
    qwen2_5_vl_vision_layer_spec,
    uses_thd_attention,
)


# One batch's grid layout, index tensors, rotary positions and attention segments.
QwenVisionBatch = PreparedVisionBatch


def prepare_batch(enc: Qwen2_5VLVisionConfig, media: dict) -> Optional[QwenVisionBatch]:
    """The family's ``prepare_batch``: from the host media's grids (None: no items)."""
    grids = item_grids(media)
    if not grids:
        return None
    return prepare_vision_batch(vision_grid_layout(grids, enc.spatial_merge_size,
                                                   enc.window_size, enc.patch_size))


def select_items(enc: Qwen2_5VLVisionConfig, media: dict, items) -> dict:
    """The family's ``select_items``: the patch rows, grids (and videos' seconds per grid)
    of items ``items`` (numbered images then videos, sorted), as the batch's media."""
    out, first = {}, 0
    for rows, grid, extra in ((IMAGE, IMAGE_GRID, ()), (VIDEO, VIDEO_GRID, (SECONDS,))):
        grids = media.get(grid)
        n = 0 if grids is None else grids.shape[0]
        if n == 0:
            continue
        mine = [i - first for i in items if first <= i < first + n]
        ends = torch.cumsum(grids.prod(-1), 0).tolist()  # host media
        starts = [0] + ends[:-1]
        out[rows] = torch.cat([media[rows][starts[i]:ends[i]] for i in mine]) if mine \
            else media[rows][:0]
        out[grid] = grids[mine]
        out.update({k: media[k][mine] for k in extra if k in media})
        first += n
    return out


class Qwen2_5VLEncoder(EncoderParts, MegatronModule):
    """The vision tower, or the part of it one pipeline chunk holds."""

    def __init__(self, config, encoder: Qwen2_5VLVisionConfig, layer_spec, embed: bool = True,
                 build_layers: bool = True, post: bool = True, vp_stage=None,
                 pg_collection=None, checkpoint_dp_group=None):
        super().__init__(config=config)
        self.use_encoder_groups(pg_collection, checkpoint_dp_group)
        self.encoder_config = encoder
        self.batch: Optional[QwenVisionBatch] = None
        self.pad = 0  # sequence-parallel padding of the bound batch
        self.has_embed, self.has_post = embed, post
        if embed:
            self.patch_embed = torch.nn.Linear(encoder.patch_input_size, encoder.hidden_size,
                                               bias=False, dtype=config.params_dtype)
            config.init_method(self.patch_embed.weight)
        self.rotary = Qwen2_5VisionRotaryEmbedding(encoder.head_dim, encoder.rope_theta)
        self.decoder = (encoder_block(config, layer_spec, vp_stage, pg_collection)
                        if build_layers else None)
        # the TE spec's layers take THD segments, the local one's masks
        self.thd = self.decoder is not None and uses_thd_attention(self.decoder)
        self.ln_post = (SequenceParallelNorm(config=config, hidden_size=encoder.hidden_size,
                                         eps=encoder.norm_epsilon) if post else None)

    @property
    def sp_ranks(self) -> int:
        """TP ranks the packed sequence is split over (1: not split)."""
        return self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1

    def layer_length(self, patches: int) -> int:
        """The sequence the layers run for ``patches`` packed patches: under sequence
        parallelism padded with whole merge units to a multiple of TP x unit, so each
        rank's shard holds whole units (the merger then runs on the shard)."""
        return patches + (-patches % (self.encoder_config.merge_unit * self.sp_ranks))

    def bind_batch(self, batch: Optional[QwenVisionBatch]) -> None:
        """The batch's prepared layout (``prepare_batch``, on the device), for the parts
        that run next; under sequence parallelism its positions take the padding (whose
        masks make it a segment of its own: no real patch attends to it)."""
        self.pad = 0
        if batch is not None and self.sp_ranks > 1:
            p = batch.layout.num_patches
            self.pad = self.layer_length(p) - p
            if self.pad:
                batch = PreparedVisionBatch(
                    batch.layout, batch.window_index, batch.reverse_index,
                    torch.cat([batch.positions, batch.positions.new_zeros(self.pad, 2)]),
                    batch.attention)
        self.batch = batch

    def _batch(self) -> QwenVisionBatch:
        if self.batch is None:
            raise RuntimeError("the qwen2_5_vl encoder runs on a batch layout computed on "
                               "the host, bound before it runs (MultimodalModel.front / "
                               "bind_encoder_media); this caller bound none")
        return self.batch

    def media_input(self, media: dict) -> Optional[torch.Tensor]:
        """The patch rows of every item, images then videos (the features' order)."""
        rows = [media[k] for k in (IMAGE, VIDEO) if media.get(k) is not None
                and media[k].shape[0]]
        if not rows:
            return None
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def _units(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        unit = self.encoder_config.merge_unit
        return x.reshape(-1, unit, *x.shape[1:]).index_select(0, index).reshape(x.shape)

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        """[patches, C*T*P*P] rows -> [patches, 1, hidden], windows contiguous."""
        batch = self._batch()
        if pixels.shape[0] != batch.layout.num_patches:
            raise ValueError(f"{pixels.shape[0]} patch rows; the batch's grids need "
                             f"{batch.layout.num_patches}")
        x = self.patch_embed(pixels.to(self.patch_embed.weight.dtype))
        return self.to_sequence_parallel(self._units(x, batch.window_index).unsqueeze(1))

    def to_sequence_parallel(self, x: torch.Tensor) -> torch.Tensor:
        """The packed patches [patches, 1, hidden] as the layers run them (the embedded
        patches; the tower's output the separate placement's LLM receives whole): under
        sequence parallelism padded with whole merge units (``layer_length``) and this
        rank's shard, as ``merge_units`` takes it."""
        if self.sp_ranks == 1:
            return x
        pad = self.layer_length(x.shape[0]) - x.shape[0]
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        return sequence_parallel.split(x, self.sequence_parallel_group)

    def layer_inputs(self, hidden: torch.Tensor) -> dict:
        batch = self._batch()
        return {"rotary_pos_emb": self.rotary(batch.positions),
                **batch.attention.layer_inputs(self.thd, self.pad)}

    def shard_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ln_post(hidden)

    def project_shard(self, projector, hidden: torch.Tensor, group=None) -> torch.Tensor:
        """Under sequence parallelism: ``ln_post`` and the merger on this rank's shard
        [P_local, 1, hidden] (whole merge units), the merged tokens gathered, the padding
        dropped, back in the processor's order: [1, LLM tokens, out]."""
        return self.merge_units(projector, self.ln_post(hidden), group).unsqueeze(0)

    def merge_units(self, merger, hidden: torch.Tensor, group=None) -> torch.Tensor:
        """``merger`` on a layer's output [P, 1, hidden] (its 2x2 units side by side), back
        in the processor's order: [LLM tokens, out]. Under sequence parallelism on this
        rank's shard (whole units), the merged tokens gathered and the padding dropped."""
        merged = hidden.squeeze(1).reshape(-1, self.encoder_config.merged_size)
        y = merger(merged)
        batch = self._batch()
        if self.sp_ranks > 1:
            y = sequence_parallel.gather(y.unsqueeze(1), group).squeeze(1)
            y = y[:batch.layout.num_patches // self.encoder_config.merge_unit]
        return y.index_select(0, batch.reverse_index)

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """[patches, 1, hidden] -> [1, LLM tokens, 4 x hidden] in the processor's order."""
        merged = self.ln_post(hidden.squeeze(1)).reshape(-1, self.encoder_config.merged_size)
        return merged.index_select(0, self._batch().reverse_index).unsqueeze(0)


def build_qwen2_5_vl_encoder(enc: Qwen2_5VLVisionConfig, settings, specs, part, name: str,
                             vp_stage=None, pg_collection=None,
                             checkpoint_dp_group=None) -> Qwen2_5VLEncoder:
    """The family's builder: the part of the tower the chunk's ``part`` holds."""
    return Qwen2_5VLEncoder(
        qwen2_5_vl_vision_transformer_config(enc, settings, name), enc,
        qwen2_5_vl_vision_layer_spec(enc, specs.impl), embed=part.embed,
        build_layers=part.num_layers > 0, post=part.projector, vp_stage=vp_stage,
        pg_collection=pg_collection, checkpoint_dp_group=checkpoint_dp_group)


def build_merger(enc: Qwen2_5VLVisionConfig, proj, lm, settings, specs,
                 name: str) -> MultimodalProjector:
    """The family's projector: the patch merger's MLP (merged width -> LLM hidden)."""
    if enc.out_hidden_size != lm.hidden_size:
        raise ConfigError(f"the {name} merger outputs {enc.out_hidden_size} features but the "
                          f"LLM's --hidden-size is {lm.hidden_size}")
    return MultimodalProjector(qwen2_5_vl_merger_transformer_config(enc, settings, name),
                               merger_submodules(specs.impl), "mlp", enc.merged_size)

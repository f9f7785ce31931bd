"""Megatron-Core's pipeline layout for an encoder placed from the last rank.

Megatron-Core numbers a stack's layers in pipeline-rank order, reading the rank from its
global state. An encoder whose first layers sit on a later rank
(``--encoder-placement last``) is laid out over mirrored ranks
(``plan.pipeline.placement.stack_layout``), and this layout answers each rank's questions for the
mirrored one, so every part builds, names and checkpoints its layers with their global
numbers, as from the first rank.
"""

from __future__ import annotations

from typing import Optional

from megatron.core import parallel_state
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.pipeline_parallel_layer_layout import (
    PipelineParallelLayerLayout,
)


class MirroredLayout(PipelineParallelLayerLayout):
    """``layout`` indexed by mirrored rank: pipeline rank r reads position PP - 1 - r."""

    def _mirror(self, pp_rank: Optional[int]) -> int:
        if pp_rank is None:
            pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        return self.pipeline_model_parallel_size - 1 - pp_rank

    def get_num_layers_to_build(self, layer_type: LayerType = LayerType.decoder,
                                vp_stage: Optional[int] = None,
                                pp_rank: Optional[int] = None):
        return super().get_num_layers_to_build(layer_type, vp_stage, self._mirror(pp_rank))

    def get_layer_offset(self, layer_type: LayerType = LayerType.decoder,
                         vp_stage: Optional[int] = None, pp_rank: Optional[int] = None):
        return super().get_layer_offset(layer_type, vp_stage, self._mirror(pp_rank))

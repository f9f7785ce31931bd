"""Megatron-Core's pipeline layout for an encoder run as its own pipeline: placed from the
last rank, interleaved, or both.

Megatron-Core numbers a stack's layers in pipeline-rank order, reading the rank from its
global state. An encoder whose first layers sit on a later rank
(``--encoder-placement last``) is laid out over mirrored ranks
(``plan.pipeline.placement.stack_layout``), and this layout answers each rank's questions for the
mirrored one, so every part builds, names and checkpoints its layers with their global
numbers, as from the first rank.

An interleaved encoder (``--encoder-virtual-pipeline-model-parallel-size``) has virtual
stages of its own, whatever the LLM's: Megatron-Core's layout reads ``vp_stage`` only when
the LLM is interleaved (its global virtual size), so this layout reads the ``vp_stage``
it is given (None: the first).
"""

from __future__ import annotations

from typing import Optional

from megatron.core import parallel_state
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.pipeline_parallel_layer_layout import (
    PipelineParallelLayerLayout,
)


class MirroredLayout(PipelineParallelLayerLayout):
    """``layout`` indexed by mirrored rank (``mirrored``: pipeline rank r reads position
    PP - 1 - r) and by the virtual stage it is given."""

    def __init__(self, layout, pipeline_model_parallel_size: int, mirrored: bool = True,
                 interleaved: bool = False):
        super().__init__(layout, pipeline_model_parallel_size)
        self.mirrored = mirrored
        self.interleaved = interleaved  # virtual stages of its own (encoder_parts.encoder_block)

    def _position(self, pp_rank: Optional[int]) -> int:
        if pp_rank is None:
            pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        return self.pipeline_model_parallel_size - 1 - pp_rank if self.mirrored else pp_rank

    def get_num_layers_to_build(self, layer_type: LayerType = LayerType.decoder,
                                vp_stage: Optional[int] = None,
                                pp_rank: Optional[int] = None):
        return self.layout[self._position(pp_rank)][vp_stage or 0].count(layer_type)

    def get_layer_offset(self, layer_type: LayerType = LayerType.decoder,
                         vp_stage: Optional[int] = None, pp_rank: Optional[int] = None):
        vp, position = vp_stage or 0, self._position(pp_rank)
        return sum(self.layout[r][v].count(layer_type) for v in range(vp + 1)
                   for r in range(self.pipeline_model_parallel_size if v < vp else position))

"""Megatron-Core's affine ``MultimodalProjector`` (0.19.2) gathers its output over the TP
ranks (``gather_output=True``) but hands back this rank's bias shard to add
(``skip_bias_add=True``): at TP > 1 the sum fails on shapes. Its linear here hands back
the gathered bias (the gather's backward splits the gradient back to the shard)."""

from __future__ import annotations

import dataclasses

from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region


class GatheredBiasColumnParallelLinear(ColumnParallelLinear):
    def forward(self, input_, *args, **kwargs):
        output, bias = super().forward(input_, *args, **kwargs)
        if bias is not None and self.gather_output and self.tp_group.size() > 1:
            bias = gather_from_tensor_model_parallel_region(bias, self.tp_group)
        return output, bias


def affine_projector_submodules(submodules, projector_type: str):
    """``submodules`` with the local linear swapped for the affine projector."""
    if projector_type != "affine" or submodules.linear_fc1 is not ColumnParallelLinear:
        return submodules
    return dataclasses.replace(submodules, linear_fc1=GatheredBiasColumnParallelLinear)

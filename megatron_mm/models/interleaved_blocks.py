"""An encoder interleaved over its own pipeline
(``--encoder-virtual-pipeline-model-parallel-size``): the blocks of its rounds on one
rank, used as one block."""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_block import TransformerBlock


def encoder_block(config, spec, vp_stage=None, pg_collection=None) -> torch.nn.Module:
    """This chunk's block of the encoder's transformer layers (Megatron-Core's
    ``TransformerBlock``, numbering them globally from the config's pipeline layout); for an
    interleaved encoder (``--encoder-virtual-pipeline-model-parallel-size``: a layout with
    rounds of its own, ``MirroredLayout.interleaved``) one block per round this rank
    holds, joined (``InterleavedBlocks``)."""
    layout = config.pipeline_model_parallel_layout
    if not getattr(layout, "interleaved", False):
        return TransformerBlock(config=config, spec=spec, pre_process=True,
                                post_process=False, vp_stage=vp_stage,
                                pg_collection=pg_collection)
    rounds = [v for v in range(layout.virtual_pipeline_model_parallel_size)
              if layout.get_num_layers_to_build(vp_stage=v)]
    return InterleavedBlocks([
        TransformerBlock(config=config, spec=spec, pre_process=True, post_process=False,
                         vp_stage=v, pg_collection=pg_collection) for v in rounds])


class InterleavedBlocks(torch.nn.Module):
    """An interleaved encoder's blocks on one rank (one per round, each Megatron-Core's own
    with its layers' global numbers), used as one block: ``layers`` all of them in layer
    order (named as one block's, ``layers.0`` on: the blocks hold nothing else), the
    forward through each in turn (pieces run a range of global numbers,
    ``EncoderParts.layers``), the checkpoint under the keys one block would use."""

    def __init__(self, blocks):
        super().__init__()
        self.layers = torch.nn.ModuleList([layer for block in blocks for layer in block.layers])
        self._blocks = tuple(blocks)  # not submodules: their layers are ours, named once
        self.config = blocks[0].config
        self.pg_collection = blocks[0].pg_collection

    def train(self, mode: bool = True):
        super().train(mode)
        for block in self._blocks:
            block.training = mode
        return self

    def set_input_tensor(self, input_tensor) -> None:
        self._blocks[0].set_input_tensor(input_tensor)

    def forward(self, hidden_states, **kwargs):
        for block in self._blocks:
            hidden_states = block(hidden_states, **kwargs)
        return hidden_states

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        """Each block's: checkpoint keys by global layer number, as one block's at
        ``prefix``; local keys by this module's own layer index."""
        out, before = {}, 0
        for block in self._blocks:  # a block's local keys count its own layers from 0
            for key, value in block.sharded_state_dict(prefix, sharded_offsets,
                                                       metadata).items():
                index, rest = key[len(f"{prefix}layers."):].split(".", 1)
                out[f"{prefix}layers.{int(index) + before}.{rest}"] = value
            before += len(block.layers)
        return out

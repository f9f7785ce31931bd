"""The modules each rank of the separate placement builds (``separate.py`` plans its
program): the encoder ranks every encoder whole (patch embedding and all transformer
layers), the LLM's ranks the LLM partitioned over its own chain, with each encoder's output
norm and projector in LLM chunk 0 as with ``--encoder-schedule coarse|bubble``
(``encoder_pipeline.separate_placements``). Every parameter keeps its colocated name, so a
checkpoint moves between placements."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..pipeline.layers import Layer
from ..pipeline.partition import StagePartition
from ..pipeline.placement import ChunkPlacement, EncoderPlacement
from ..record import Record
from .encoder_pipeline import EncoderPieces, separate_placements, split_chain


@dataclass
class SeparatePlacements(Record):
    """``llm``: every LLM chunk's modules (chunk order); ``encoder``: an encoder rank's one
    chunk; ``pieces``: each encoder as one piece (its layers), the ``EF`` / ``EB`` chunk
    of the program numbering the encoders in chain order."""

    llm: List[ChunkPlacement]
    encoder: ChunkPlacement
    pieces: List[EncoderPieces]

    def encoder_chunk(self, own: Optional[int] = None) -> ChunkPlacement:
        """An encoder rank's chunk: every encoder, or only encoder ``own`` (chain order)
        when each encoder is on replicas of its own."""
        if own is None:
            return self.encoder
        return dataclasses.replace(self.encoder, encoders=[self.encoder.encoders[own]])


def separate_model_placements(chain: Sequence[Layer],
                              llm_partition: StagePartition) -> SeparatePlacements:
    encoders, _ = split_chain(chain)
    pieces = [EncoderPieces(name, [[0, sum(1 for l in layers if l.kind.endswith("_layer"))]],
                            [])  # on no LLM rank: the encoder ranks hold them
              for name, layers in encoders]
    encoder = ChunkPlacement(chunk=0, encoder_separate=True, encoder_ranks_own=True,
                             encoders=[EncoderPlacement(name=p.name, embed=True,
                                                        layers=list(p.layers[0]))
                                       for p in pieces])
    llm = separate_placements(chain, llm_partition, pieces)
    for place in llm:
        place.encoder_ranks_own = True
    return SeparatePlacements(llm, encoder, pieces)

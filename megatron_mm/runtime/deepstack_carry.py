"""DeepStack (Qwen3-VL) in the schedule executor: the outputs of the encoder layers that
feed DeepStack (``deepstack_visual_indexes``) travel from the encoder pieces that compute
them to ``F(m, 0)``, whose chunk holds the mergers.

Each piece hands on its hidden state with the outputs of the DeepStack layers up to its
own end stacked after it along the sequence: [(1 + k) T, N, H_enc], layer order. So the
features ride the pieces' messages (their shapes from the micro-batch, as the hidden
state's), and their gradients come back in the pieces' gradient messages; ``F(m, 0)``
splits them off for the mergers. The merged features then travel on from chunk 0 with
the LLM's hidden state to the chunks holding the layers that add them
(``ChunkPlacement.deepstack_layers``, ``MessageSpecs.chunk_output``).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch


def deepstack_indexes(enc) -> Tuple[int, ...]:
    """The encoder layers whose outputs feed DeepStack, in layer order (none: ())."""
    return tuple(sorted(getattr(enc, "deepstack_visual_indexes", ())))


def carried(enc, end: int) -> int:
    """How many DeepStack layer outputs a piece ending before layer ``end`` hands on."""
    return sum(i < end for i in deepstack_indexes(enc))


def split(received: torch.Tensor, k: int) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """(hidden [T, N, H], the k carried layer outputs) of a piece's message."""
    if not k:
        return received, []
    parts = received.chunk(1 + k)
    return parts[0], list(parts[1:])


def stack(out: torch.Tensor, features: Sequence[torch.Tensor]) -> torch.Tensor:
    """A piece's message: its output with the carried layer outputs after it."""
    return torch.cat([out, *features]) if features else out


def kept_by_layer(enc, features: Sequence[torch.Tensor]) -> Dict[int, torch.Tensor]:
    """{DeepStack layer: its output} of the features a last piece carried to ``F(m, 0)``."""
    return dict(zip(deepstack_indexes(enc), features))

"""Greedy decoding of M-RoPE samples: each generated token takes the next text position on
all three axes (after the largest so far), as transformers' generation does."""

import torch

from megatron_mm.data import Sample
from megatron_mm.training.loop.evaluation import _extend


def test_generated_tokens_continue_mrope_positions():
    tokens = torch.tensor([5, 6, 7])
    sample = Sample(tokens=tokens, labels=tokens.clone(), loss_mask=torch.zeros(3),
                    position_ids=torch.tensor([[0, 1, 1], [0, 1, 2], [0, 2, 1]]))
    grown = _extend(_extend(sample, 8), 9)
    assert grown.tokens.tolist() == [5, 6, 7, 8, 9]
    assert grown.position_ids.tolist() == [[0, 1, 1, 3, 4], [0, 1, 2, 3, 4], [0, 2, 1, 3, 4]]
    plain = _extend(Sample(tokens=tokens, labels=tokens.clone(), loss_mask=torch.zeros(3)), 8)
    assert plain.position_ids is None

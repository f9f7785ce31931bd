"""Build the default causal masks on the CPU.

Replaces ``megatron.core.transformer.utils.get_default_causal_mask`` and
``get_sliding_window_causal_mask`` (megatron-core 0.19.2), which allocate with
``device="cuda"``; local-spec attention calls them whenever ``attention_mask`` is None.
Rebound in ``fusions.fused_softmax`` too, which imports them by name.
"""

import torch


def get_default_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def get_sliding_window_causal_mask(sq, skv, window_size):
    m = torch.ones(sq, skv, dtype=torch.bool)
    mu = torch.triu(m, diagonal=skv - sq - window_size[0])
    return ~torch.tril(mu, diagonal=skv - sq + window_size[1])


def apply() -> None:
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils

    for module in (utils, fused_softmax):
        module.get_default_causal_mask = get_default_causal_mask
        module.get_sliding_window_causal_mask = get_sliding_window_causal_mask

"""Packed micro-batches: several samples in one sequence, none attending to another.

Balanced batching (``--data-balance``) makes each micro-batch one packed sequence of a
group of samples: no pad tokens. Isolation is a block-diagonal causal mask (each sample's
tokens see only earlier tokens of the same sample), which the training step makes on the
device from ``cu_seqlens`` (``training/attention.py``: O(S) codes cross, not the S x S
mask) and Megatron-Core's local ``DotProductAttention`` applies as given; position ids
restart at 0 for every sample (GPTModel's RoPE is relative, so a sample's attention does
not depend on its offset);
samples with M-RoPE positions ([3, S] ``Sample.position_ids``) are concatenated as they are,
[3, 1, S] in all (a padding segment counts 0, 1, ... as text).
A sample's last token carries no loss, so no sample learns to predict the next one.
"""
from __future__ import annotations

import torch

from .processing import Sample, sample_positions


def collate_packed(samples: list[Sample], pad_id: int, pad_to_multiple_of: int = 1) -> dict:
    """One packed sequence of ``samples`` (batch of 1), the keys of ``collate`` plus
    ``cu_seqlens`` (sample boundaries, as PackedSeqParams takes; the mask's documents).
    A length short of a multiple of ``pad_to_multiple_of`` gets a padding segment of its
    own (pad tokens, no loss, attending only to itself)."""
    if not samples:
        raise ValueError("collate_packed() got an empty list of samples")
    short = -sum(len(s.tokens) for s in samples) % pad_to_multiple_of
    if short:
        pad = torch.full((short,), pad_id, dtype=samples[0].tokens.dtype)
        samples = list(samples) + [Sample(tokens=pad, labels=pad.clone(),
                                          loss_mask=torch.zeros(short), media={},
                                          prompt_len=0, answer="", record_id="")]
    lengths = [len(s.tokens) for s in samples]
    real = samples[:len(samples) - bool(short)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    media = {}
    for name in sorted({m for s in samples for m in s.media}):
        media[name] = torch.cat([s.media[name] for s in samples if name in s.media])
    if any(s.position_ids is not None for s in samples):
        positions = torch.cat([sample_positions(s) for s in samples], dim=1)[:, None]
    else:
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return {
        "tokens": torch.cat([s.tokens for s in samples])[None],
        "labels": torch.cat([s.labels for s in samples])[None],
        "loss_mask": torch.cat([s.loss_mask for s in samples])[None],
        "position_ids": positions,
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "media": media,
        "prompt_lens": [s.prompt_len for s in real],
        "answers": [s.answer for s in real],
        "record_ids": [s.record_id for s in real],
    }

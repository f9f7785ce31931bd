"""What one CP rank needs to run its share of a micro-batch: the mask codes of the whole
sequence, the global positions of its tokens (from the plan's token assignment) and, per
run of its query tokens, the key interval those queries attend.

It travels to the model as ``attention_mask`` (Megatron-Core hands that argument to every
layer's core attention untouched), so the model selects its tokens, RoPE runs at global
positions and ``ContextParallelAttention`` evaluates the mask at global positions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..plan.context_parallel.attention_mask import DOC_SHIFT, ITEM_MASK, key_intervals, mask_codes
from ..plan.context_parallel.cp_assignment import BLOCK_OVERHEAD, CPAssignment, assign_tokens
from .host_copy import to_device


@dataclass
class ContextParallelMask:
    codes: torch.Tensor  # [B, S] int64, the whole sequence (plan/context_parallel/attention_mask)
    local: torch.Tensor  # [S_local] long: this rank's global token positions, sorted
    order: torch.Tensor  # [S] long: every rank's positions, in rank order
    counts: List[int]  # tokens per CP rank
    runs: List[Tuple[int, int, int, int]]  # (local start, end, key lo, key hi + 1)
    replicated: bool  # too short to split: every rank holds everything
    cp_rank: int
    group: Optional[torch.distributed.ProcessGroup]

    def to(self, device) -> "ContextParallelMask":
        """The same mask with its tensors on ``device`` (it is planned on the host)."""
        return dataclasses.replace(self, codes=to_device(self.codes, device),
                                   local=to_device(self.local, device),
                                   order=to_device(self.order, device))

    def take(self, x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """This rank's columns of a [B, S, ...] tensor (on the mask's device)."""
        return None if x is None else x[:, self.local]

    def take_positions(self, position_ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """This rank's columns of [B, S] or M-RoPE's [3, B, S] position ids: each token
        then rotates at its own (3-D) position, wherever it sits in the sequence."""
        return None if position_ids is None else position_ids[..., self.local]

    def take_loss_mask(self, loss_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The loss mask of this rank's tokens; when nothing is split only CP rank 0 takes
        the loss (the token count, and the gradient, must not count CP times)."""
        local = self.take(loss_mask)
        if local is not None and self.replicated and self.cp_rank != 0:
            local = torch.zeros_like(local)
        return local


def allowed(codes_q: torch.Tensor, pos_q: torch.Tensor, codes_k: torch.Tensor,
            pos_k: torch.Tensor) -> torch.Tensor:
    """The mask rule of ``plan/context_parallel/attention_mask.py`` in torch:
    [B, Q] x [B, K] -> [B, Q, K] bool, True where the query may attend the key."""
    doc_q, item_q = codes_q >> DOC_SHIFT, codes_q & ITEM_MASK
    doc_k, item_k = codes_k >> DOC_SHIFT, codes_k & ITEM_MASK
    same_doc = doc_q[:, :, None] == doc_k[:, None, :]
    causal = (pos_k[None, :] <= pos_q[:, None])[None]
    same_item = item_q[:, :, None] == item_k[:, None, :]
    return same_doc & torch.where((item_q == 0)[:, :, None], causal, same_item)


def batch_codes(tokens: torch.Tensor, media_tokens: Mapping[int, int],
                doc_ids: Optional[torch.Tensor], media_attention: str) -> np.ndarray:
    docs = None if doc_ids is None else doc_ids.cpu().numpy()
    return mask_codes(tokens.cpu().numpy(), media_tokens, docs, media_attention)


def dense_mask(codes: np.ndarray, device) -> torch.Tensor:
    """[B, 1, S, S] bool, True = masked: Megatron-Core's local attention mask, made on
    ``device`` from the [B, S] codes (only they cross from the host)."""
    c = to_device(torch.from_numpy(codes), device)
    pos = torch.arange(c.shape[1], device=c.device)
    return (~allowed(c, pos, c, pos))[:, None]


def context_parallel_mask(codes: np.ndarray, cp_size: int, cp_rank: int, method: str,
                          block: int, group, device,
                          block_overhead: float = BLOCK_OVERHEAD) -> ContextParallelMask:
    """Plan the token assignment of [B, S] ``codes`` and keep this rank's part."""
    plan: CPAssignment = assign_tokens(codes, cp_size, method, block=block,
                                       block_overhead=block_overhead)
    local = np.asarray(plan.tokens[cp_rank], np.int64)
    # Runs of consecutive local positions (the assignment's blocks, merged), each with the
    # union of its rows' key intervals over the batch: the keys its queries need.
    lo = np.min([key_intervals(c)[0] for c in codes], axis=0)
    hi = np.max([key_intervals(c)[1] for c in codes], axis=0)
    breaks = np.flatnonzero(np.diff(local) != 1) + 1
    runs, start = [], 0
    for end in list(breaks) + [len(local)]:
        rows = local[start:end]
        # Cut long runs back to blocks, so each block only reaches the keys it needs.
        for s in range(0, len(rows), block):
            part = rows[s:s + block]
            runs.append((start + s, start + s + len(part), int(lo[part].min()),
                         int(hi[part].max()) + 1))
        start = end
    order = np.concatenate([np.asarray(t, np.int64) for t in plan.tokens])
    host = ContextParallelMask(
        codes=torch.from_numpy(codes), local=torch.from_numpy(local),
        order=torch.from_numpy(order), counts=[len(t) for t in plan.tokens],
        runs=runs, replicated=plan.replicated, cp_rank=cp_rank, group=group)
    return host.to(device)

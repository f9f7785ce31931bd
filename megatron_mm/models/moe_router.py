"""Megatron-Core's top-k router with the load-balancing loss's gradient scaled by the
sequence's valid tokens whatever the split.

With ``calculate_per_token_loss`` Megatron-Core (0.19.2, ``Router.
attach_and_log_load_balancing_loss``) multiplies a rank's aux loss by ``valid_token_count``
times the TP x CP size, meant as the rank's own tokens times the group's size (the
sequence's tokens). With a ``padding_mask`` that count comes from
``get_tokens_per_expert_and_token_count`` after the in-place all-reduce of the per-expert
counts, so it is already the group's total: the gradient comes out TP x CP times too large
under sequence or context parallelism, and one process's run differs. Here every rank of
the group passes the group's valid tokens divided by its size, which sums to the
sequence's count as one process has it (without padding: the rank's own count, as
upstream). A sequence too short for context parallelism to split is held whole by every CP
rank: only CP rank 0's copy counts there (each rank's aux loss is then half the sequence's,
as its probabilities are averaged over both copies' tokens).
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.transformer.moe.router import TopKRouter


class SequenceScaledRouter(TopKRouter):
    _group_tokens: Optional[torch.Tensor] = None  # this micro-batch's valid tokens (TP x CP)
    # Set by MultimodalModel per micro-batch: this CP rank holds a copy of a sequence too
    # short to split (CP rank 0's copy counts); its tokens are then not counted twice.
    duplicate_tokens: bool = False

    def routing(self, logits: torch.Tensor, padding_mask: Optional[torch.Tensor] = None):
        self._group_tokens = None
        if padding_mask is not None and self.tp_cp_group.size() > 1 \
                and self.training and torch.is_grad_enabled():
            tokens = (~padding_mask).sum().to(torch.float32) * (not self.duplicate_tokens)
            torch.distributed.all_reduce(tokens, group=self.tp_cp_group)
            self._group_tokens = tokens
        return super().routing(logits, padding_mask)

    def attach_and_log_load_balancing_loss(self, activation, aux_loss_coeff, aux_loss,
                                           aux_loss_name, reduce_group, needs_dp_avg=True,
                                           valid_token_count=None):
        if self._group_tokens is not None and reduce_group is self.tp_cp_group:
            valid_token_count = self._group_tokens / reduce_group.size()
        return super().attach_and_log_load_balancing_loss(
            activation, aux_loss_coeff, aux_loss, aux_loss_name, reduce_group,
            needs_dp_avg=needs_dp_avg, valid_token_count=valid_token_count)

"""An MoE LLM's metrics per iteration: Megatron-LM's ``track_moe_metrics`` (the routers'
``load_balancing_loss`` from Megatron-Core's ``MoEMetricsTracker``: summed over the
micro-batches, scaled by 1 / their number, averaged over the MoE layers and the
data-parallel ranks; TensorBoard ``load_balancing_loss`` and, with
``--moe-per-layer-logging``, ``moe/load_balancing_loss_layer_<i>``) and the tokens each
expert was routed (``tokens_per_expert``: every rank's training tokens, summed over the
MoE layers; TensorBoard ``moe/tokens_per_expert_<e>``, per layer
``moe/tokens_per_expert_<e>_layer_<i>``). Every rank calls ``report`` (it all-reduces)."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
from megatron.core.transformer.moe.router import TopKRouter

from ...runtime.collective_device import collective_device

# --moe-router-load-balancing-type -> the tracker's name of its loss (Megatron-LM's)
LOSS_NAMES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
              "global_aux_loss": "global_load_balancing_loss"}


class MoEMetrics:
    """Counts the routed tokens of this rank's MoE layers (a forward hook on each
    Megatron-Core router, training forwards only) and reports the step's metrics."""

    def __init__(self, config, model_chunks):
        lm = config.model_config.language
        self.config, self.num_layers = config, lm.num_layers
        self.pattern = list(lm.moe.pattern(lm.num_layers))
        self.counts = torch.zeros(lm.num_layers, lm.moe.num_experts, dtype=torch.float64,
                                  device=collective_device())
        for chunk in model_chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    module.register_forward_hook(self._count)

    def _count(self, router, inputs, output) -> None:
        # duplicate_tokens: a CP rank's copy of a sequence too short to split (multimodal.py)
        if router.training and torch.is_grad_enabled() and \
                not getattr(router, "duplicate_tokens", False):
            _, routing_map = output
            padding = inputs[1] if len(inputs) > 1 else None  # [S, B], True: padding
            if padding is not None:
                routing_map = routing_map & ~padding.reshape(-1, 1)
            self.counts[router.layer_number - 1] += routing_map.sum(0).to(self.counts)

    def report(self, iteration: int, writers=None) -> Dict[str, torch.Tensor]:
        """The step's ``load_balancing_loss`` (when the aux loss is on) and
        ``tokens_per_expert`` ([E], summed over the MoE layers), on the device (read on the
        host with the interval's other values); written to ``writers`` (TensorBoard /
        wandb, None off the last rank: only that rank reads them now, as in Megatron-LM)."""
        moe, per_layer = self.config.model_config.language.moe, self.config.moe
        name = LOSS_NAMES.get(moe.router_load_balancing_type)
        out: Dict[str, torch.Tensor] = {}
        if name is not None and moe.aux_loss_coeff > 0:
            get_moe_metrics_tracker().report(
                loss_scale=1.0 / self.config.training.num_microbatches, iteration=iteration,
                writer=writers, per_layer_logging=per_layer.moe_per_layer_logging,
                force_initialize=True, track_names=[name], num_layers=self.num_layers,
                moe_layer_freq=self.pattern, total_loss_dict=out)
        torch.distributed.all_reduce(self.counts)  # PP: other layers; TP/CP/DP: other tokens
        counts = self.counts.clone()
        self.counts.zero_()
        out["tokens_per_expert"] = counts.sum(0)
        if writers is not None:
            for e, c in enumerate(out["tokens_per_expert"].tolist()):
                writers.add_scalar(f"moe/tokens_per_expert_{e}", c, iteration)
            if per_layer.moe_per_layer_logging:
                for i in (i for i, sparse in enumerate(self.pattern) if sparse):
                    for e, c in enumerate(counts[i].tolist()):
                        writers.add_scalar(f"moe/tokens_per_expert_{e}_layer_{i}", c,
                                           iteration)
        return out


def read_moe(steps: Dict[int, Dict[str, object]]) -> Dict[int, Dict[str, object]]:
    """The steps' metrics on the host (those still on the device read now, at a log
    interval): losses as floats, token counts as lists of ints."""
    def host(v):
        if not torch.is_tensor(v):
            return v
        return [int(c) for c in v.tolist()] if v.dim() else float(v)
    return {it: {k: host(v) for k, v in m.items()} for it, m in steps.items()}


def moe_metrics(config, model_chunks) -> Optional[MoEMetrics]:
    """The metrics of an MoE LLM; None for a dense one."""
    if config.model_config.language.moe is None:
        return None
    return MoEMetrics(config, model_chunks)

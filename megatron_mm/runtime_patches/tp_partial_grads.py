"""Sum over tensor-parallel ranks the gradients of replicated weights that each TP rank
sees only part of (Gated DeltaNet's output norm), with or without sequence parallelism.

In megatron-core 0.19.2 ``finalize_model_grads._allreduce_non_tensor_model_parallel_grads``
sums a replicated weight's gradient over TP only under sequence parallelism (weights
marked ``sequence_parallel``) or for ``q_layernorm`` / ``k_layernorm`` (by name). The
GDN's ``out_norm`` (``ssm.gated_delta_net.common._GDNBase``) normalises each value head
with one weight shared by all heads, and TP splits the heads: each rank's gradient holds
its heads' share. Without ``--sequence-parallel`` nothing sums it, so the TP ranks' copies
drift apart from the first step (Megatron-LM issue 7452 reports it too).

Weights marked ``sum_gradients_across_tp_domain`` (``mark``; the GDN spec marks its output
norm) get their gradients summed over the TP group after upstream's reduction, unless
upstream already summed them (sequence parallelism). Upstream's fix
(``patches/0007-...``) reads the same attribute; where it is installed this patch does
nothing.
"""

from __future__ import annotations

import importlib
import inspect

import torch

ATTRIBUTE = "sum_gradients_across_tp_domain"


def mark(module: torch.nn.Module) -> torch.nn.Module:
    """Mark ``module``'s weights as replicated over TP with partial gradients per rank."""
    for param in module.parameters():
        setattr(param, ATTRIBUTE, True)
    return module


def _summed_upstream(param, name: str, config) -> bool:
    """Whether upstream 0.19.2 already sums (or averages) this weight's gradient over TP."""
    return bool(getattr(param, "average_gradients_across_tp_domain", False)
                or (config.sequence_parallel and getattr(param, "sequence_parallel", False))
                or (config.qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name)))


def apply() -> None:
    from megatron.core.utils import get_attr_wrapped_model

    # the module (the package's ``finalize_model_grads`` is its function)
    fmg = importlib.import_module("megatron.core.distributed.finalize_model_grads")

    upstream = fmg._allreduce_non_tensor_model_parallel_grads
    if hasattr(upstream, "__wrapped__") or ATTRIBUTE in inspect.getsource(upstream):
        return  # applied already, or upstream reads the attribute (the patch file's fix)

    def _allreduce_non_tensor_model_parallel_grads(model, config, tp_group=None):
        upstream(model, config, tp_group)
        tp_group = fmg.get_tensor_model_parallel_group_if_none(tp_group)
        if tp_group.size() <= 1:
            return
        params, grads = [], []
        for chunk in model:
            for name, param in get_attr_wrapped_model(chunk, "named_parameters")():
                if (not param.requires_grad or not getattr(param, ATTRIBUTE, False)
                        or _summed_upstream(param, name, config)):
                    continue
                grad = getattr(param, fmg._get_main_grad_attr(param))
                if grad is not None:
                    params.append(param)
                    grads.append(fmg._unshard_if_dtensor(grad).data)
        if grads:
            coalesced = fmg._flatten_dense_tensors(grads)
            torch.distributed.all_reduce(coalesced, group=tp_group)
            for buf, synced in zip(grads, fmg._unflatten_dense_tensors(coalesced, grads)):
                buf.copy_(synced)

    _allreduce_non_tensor_model_parallel_grads.__wrapped__ = upstream
    fmg._allreduce_non_tensor_model_parallel_grads = _allreduce_non_tensor_model_parallel_grads
    fmg._allreduce_layernorm_grads = _allreduce_non_tensor_model_parallel_grads

"""Fix DistributedOptimizer checkpoint loading with torch's own Adam/AdamW.

Replaces ``DistributedOptimizer._set_main_param_and_optimizer_states`` and wraps
``DistributedOptimizer.load_state_dict`` (megatron-core 0.19.2). Without TE or Apex the
inner optimizer is torch AdamW, and upstream then (a) copies into leaf views that require
grad outside ``no_grad`` (RuntimeError on ``dp_reshardable``), (b) expects a ``step`` key
in the loaded tensors (KeyError on ``fully_reshardable``) and (c) gives every parameter one
shared ``step`` tensor, which AdamW then advances once per parameter per iteration.
"""

import torch


def _set_main_param_and_optimizer_states(self, model_param, tensors, _upstream=None):
    if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        return _upstream(self, model_param, tensors)
    group_index, group_order = self.model_param_group_index_map[model_param]
    main_param = self.optimizer.param_groups[group_index]["params"][group_order]
    dst = {"param": main_param}
    for key, value in self.optimizer.state[main_param].items():
        if isinstance(value, torch.Tensor) and key != "step":
            dst[key] = value
    with torch.no_grad():
        for key, tensor in dst.items():
            src = tensors.get(key)
            if isinstance(src, torch.Tensor):
                tensor.copy_(src)


def _wrap_load_state_dict(load_state_dict):
    def wrapped(self, state_dict):
        load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].detach().clone()

    wrapped.__wrapped__ = load_state_dict
    return wrapped


def apply() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if getattr(DistributedOptimizer, "_megatron_mm_distopt_load", False):
        return
    upstream = DistributedOptimizer._set_main_param_and_optimizer_states
    DistributedOptimizer._set_main_param_and_optimizer_states = (
        lambda self, model_param, tensors: _set_main_param_and_optimizer_states(
            self, model_param, tensors, upstream
        )
    )
    DistributedOptimizer.load_state_dict = _wrap_load_state_dict(
        DistributedOptimizer.load_state_dict
    )
    DistributedOptimizer._megatron_mm_distopt_load = True

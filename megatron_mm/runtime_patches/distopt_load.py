"""Fix DistributedOptimizer checkpoint loading with torch's own Adam/AdamW.

Replaces ``DistributedOptimizer._set_main_param_and_optimizer_states`` and wraps
``DistributedOptimizer.load_state_dict`` and ``DistributedOptimizer.state_dict``
(megatron-core 0.19.2). Without TE or Apex the inner optimizer is torch AdamW, and upstream
then (a) copies into leaf views that require grad outside ``no_grad`` (RuntimeError on
``dp_reshardable``), (b) expects a ``step`` key in the loaded tensors (KeyError on
``fully_reshardable``), (c) gives every parameter one shared ``step`` tensor, which AdamW
then advances once per parameter per iteration, and (d) cannot load into a fresh optimizer
at all: ``sharded_state_dict(is_loading=True)`` calls ``state_dict()``, which asserts that
the (still empty) optimizer state holds exactly one ``step`` value.
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


def _wrap_state_dict(state_dict):
    def wrapped(self):
        from megatron.core.optimizer import distrib_optimizer

        inner = getattr(self, "optimizer", None)
        if (distrib_optimizer.HAVE_APEX_OR_TE or inner is None
                or any("step" in s for s in inner.state.values())):
            return state_dict(self)
        # Nothing has stepped yet: upstream's torch-optimizer branch collects the steps
        # from the (empty) state and asserts there is exactly one. Step 0 is the truth.
        inner_state_dict = inner.state_dict()
        result = {"optimizer": {k: v for k, v in inner_state_dict.items() if k != "state"}}
        for param_group in result["optimizer"]["param_groups"]:
            del param_group["params"]
            param_group["step"] = 0
        if self.grad_scaler:
            result["grad_scaler"] = self.grad_scaler.state_dict()
        return result

    wrapped.__wrapped__ = state_dict
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
    DistributedOptimizer.state_dict = _wrap_state_dict(DistributedOptimizer.state_dict)
    DistributedOptimizer._megatron_mm_distopt_load = True

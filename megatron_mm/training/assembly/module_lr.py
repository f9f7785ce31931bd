"""Per-module learning rates and weight decay as Megatron-Core's optimizer overrides.

``get_megatron_optimizer(config, chunks, config_overrides)`` groups parameters by the
``ParamGroupOverride`` their ``ParamKey`` matches (its name patterns against the
DDP-wrapped chunks' parameter names); ``OptimizerParamScheduler`` then runs the one
schedule per group between the group's ``max_lr`` and ``min_lr`` and sets its weight decay
from ``start_wd`` / ``end_wd`` times ``wd_mult``. Megatron-Core's standard overrides (no
weight decay on biases and 1-D parameters) stay: ours merge with them.
"""

from __future__ import annotations

from typing import Dict, Iterable

from megatron.core.optimizer import OptimizerConfig, ParamKey, get_standard_config_overrides
from megatron.core.optimizer_param_scheduler import ParamGroupOverride

from ..config.module_lr_args import ModuleRate

# module -> the parameter names it holds (``MultimodalModel``'s attributes, under any
# wrapper prefix: ``module.module.vision_model.…``)
PATTERNS = {"vision": ("*vision_model.*",), "audio": ("*audio_model.*",),
            "projector": ("*_projection.*",)}


def module_override(rate: ModuleRate, training) -> ParamGroupOverride:
    """The group settings of one module (``training``: the TrainingArgs), or {} where they
    equal the LLM's: a group identical to the default one would share its identity in a
    checkpoint (Megatron-Core matches saved groups by these values)."""
    max_lr = training.lr if rate.lr is None else rate.lr
    min_lr = training.min_lr if rate.min_lr is None else rate.min_lr
    override = ParamGroupOverride(max_lr=max_lr, min_lr=min_lr)
    if rate.weight_decay is not None and rate.weight_decay != training.weight_decay:
        override.update(start_wd=rate.weight_decay, end_wd=rate.weight_decay)
    elif (max_lr, min_lr) == (training.lr, training.min_lr):
        return ParamGroupOverride()
    return override


def config_overrides(config: OptimizerConfig, rates: Iterable[ModuleRate],
                     training) -> Dict[ParamKey, ParamGroupOverride]:
    """Megatron-Core's standard overrides plus one per module with settings of its own."""
    out = get_standard_config_overrides(config)
    for rate in rates:
        override = module_override(rate, training)
        if override:
            out[ParamKey(name=PATTERNS[rate.module])] = override
    return out


def module_learning_rates(optimizer, rates: Iterable[ModuleRate], training) -> Dict[str, float]:
    """module -> the learning rate its parameter group has now (set by the scheduler's
    last step; every rank holds every group, empty where it holds none of the module)."""
    out = {}
    for rate in rates:
        override = module_override(rate, training)
        if rate.lr is None or not override:  # its rate is --lr's
            continue
        for group in optimizer.param_groups:
            if all(group.get(k) == v for k, v in override.items()):
                out[rate.module] = float(group["lr"])
                break
    return out

"""Per-module optimizer flags: ``--vision-lr``, ``--audio-lr``, ``--projector-lr`` with
their ``-min-lr`` and ``-weight-decay`` counterparts, in the style of Megatron-LM's
``--decoupled-lr`` / ``--decoupled-min-lr``.

Absolute values, not multipliers: Megatron-LM's ``--decoupled-lr`` and Megatron-Core's
per-group overrides (``max_lr``, ``min_lr``) are absolute, and so are the recipes people
copy them from (LLaVA's ``mm_projector_lr``, ms-swift's ``vit_lr`` / ``aligner_lr``).
Every module follows the one ``--lr-decay-style`` / warm-up schedule between its own
``lr`` and ``min-lr``; a module without its own ``--X-min-lr`` decays to ``--min-lr`` (as
``--decoupled-min-lr`` defaults to it). The LLM keeps ``--lr`` / ``--min-lr`` /
``--weight-decay``. No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ...config import ConfigError
from ...families import SLOTS

# module -> (what its flags name, the freezing flag that would leave it nothing to train)
MODULES = {**{slot: (f"the {slot} encoder", f"--{flag.replace('_', '-')}")
              for slot, flag in SLOTS.items()},
           "projector": ("the projectors", "--freeze-projector")}
SETTINGS = ("lr", "min_lr", "weight_decay")


@dataclass(frozen=True)
class ModuleRate:
    """One module's optimizer settings, each None where the module takes the LLM's."""

    module: str
    lr: Optional[float] = None
    min_lr: Optional[float] = None
    weight_decay: Optional[float] = None

    def flag(self, setting: str) -> str:
        return f"--{self.module}-{setting.replace('_', '-')}"


def module_rates(training) -> Tuple[ModuleRate, ...]:
    """The modules given a setting of their own (``training``: the TrainingArgs)."""
    out = []
    for module in MODULES:
        values = {s: getattr(training, f"{module}_{s}") for s in SETTINGS}
        if any(v is not None for v in values.values()):
            out.append(ModuleRate(module, **values))
    return tuple(out)


def _trains(module: str, model_config, lora_modules) -> Optional[str]:
    """None if ``module`` has parameters to train, else why not."""
    freeze = model_config.freeze
    encoders = set(model_config.encoders)
    if module == "projector":
        if not encoders:
            return "the model has no encoder (hence no projector)"
        if freeze.projectors == encoders and not any(m.endswith("_projection")
                                                     for m in lora_modules):
            return "--freeze-projector freezes every projector"
        return None
    if module not in encoders:
        return f"the model has no {module} encoder (--{module}-model-type)"
    if module in freeze.encoders and f"{module}_model" not in lora_modules:
        return f"{MODULES[module][1]} freezes it"
    return None


def validate_module_lr_args(config, lora_modules=()) -> None:
    """Each module flag names a module that trains (``lora_modules``: those with LoRA
    adapters, which train although their base weights are frozen), with min <= peak."""
    for rate in module_rates(config.training):
        why = _trains(rate.module, config.model_config, lora_modules)
        if why is not None:
            given = next(rate.flag(s) for s in SETTINGS if getattr(rate, s) is not None)
            raise ConfigError(f"{given} sets the optimizer of {MODULES[rate.module][0]}, "
                              f"which has nothing to train: {why}")
        for s in SETTINGS:
            value = getattr(rate, s)
            if value is not None and value < 0:
                raise ConfigError(f"{rate.flag(s)} must not be negative")
        if rate.min_lr is not None and rate.lr is None:
            raise ConfigError(f"{rate.flag('min_lr')} needs {rate.flag('lr')}")
        peak = config.training.lr if rate.lr is None else rate.lr
        low = config.training.min_lr if rate.min_lr is None else rate.min_lr
        if low > peak:
            raise ConfigError(f"{rate.flag('min_lr') if rate.min_lr is not None else '--min-lr'}"
                              f" ({low}) exceeds {rate.flag('lr')} ({peak})"
                              + ("" if rate.min_lr is not None else
                                 f"; pass {rate.flag('min_lr')}"))

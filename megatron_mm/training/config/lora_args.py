"""LoRA flags: ``--lora-rank`` turns adapters on (``--lora-alpha``, ``--lora-dropout``,
``--lora-target-modules``), Megatron-Bridge's and PEFT's settings under ms-swift's flag
names. No torch import.

A target is ``[MODULE.]PROJECTION``: a Hugging Face projection name (q_proj, k_proj,
v_proj, o_proj, gate_proj, up_proj, down_proj; a non-gated MLP's two linears are up_proj
and down_proj) or ``all-linear``, in the LLM (``language_model``, the default module) or in
``vision_model`` / ``audio_model`` (an encoder's layers) or ``vision_projection`` /
``audio_projection`` (a projector). The default: every linear of the LLM's attention and
MLP. A module with adapters has its base weights frozen; the others train as their
``--freeze-*`` flags say.
"""

from __future__ import annotations

from typing import Dict, Tuple

from ...config import ConfigError, LoraConfig

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULES = {"language_model": None, "vision_model": "vision", "audio_model": "audio",
           "vision_projection": "vision", "audio_projection": "audio"}  # -> encoder slot
FREEZE_FLAGS = {"language_model": "--freeze-LM", "vision_model": "--freeze-ViT",
                "audio_model": "--freeze-audio", "vision_projection": "--freeze-projector",
                "audio_projection": "--freeze-projector"}


def parse_targets(entries) -> Dict[str, Tuple[str, ...]]:
    out: Dict[str, list] = {}
    for entry in entries:
        module, _, name = entry.rpartition(".")
        module = module or "language_model"
        if module not in MODULES:
            raise ConfigError(f"--lora-target-modules {entry}: no module {module!r} (one of "
                              f"{', '.join(MODULES)})")
        if name != "all-linear" and name not in TARGETS:
            raise ConfigError(f"--lora-target-modules {entry}: no projection {name!r} (one "
                              f"of {', '.join(TARGETS)}, all-linear)")
        names = TARGETS if name == "all-linear" else (name,)
        out.setdefault(module, []).extend(n for n in names if n not in out.get(module, []))
    return {m: tuple(n for n in TARGETS if n in names) for m, names in out.items()}


def lora_config(config):
    """The LoraConfig of the RunConfig's flags (None without ``--lora-rank``), checked against the
    model config ``config.model_config``."""
    if config.model.lora_rank is None:
        return None
    if config.model.lora_rank < 1:
        raise ConfigError("--lora-rank must be >= 1")
    if config.model.lora_alpha <= 0:
        raise ConfigError("--lora-alpha must be positive")
    if not 0 <= config.model.lora_dropout < 1:
        raise ConfigError("--lora-dropout must be in [0, 1)")
    if config.model.transformer_impl == "transformer_engine":
        raise ConfigError("--lora-rank needs --transformer-impl local: Transformer Engine's "
                          "linears fuse the layer norm into the QKV / fc1 GEMM, whose "
                          "normalised input the adapters would need")
    targets = parse_targets(config.model.lora_target_modules)
    model_config = config.model_config
    freeze = model_config.freeze
    for module in targets:
        slot = MODULES[module]
        if slot is not None and slot not in model_config.encoders:
            raise ConfigError(f"--lora-target-modules {module}.*: the model has no {slot} "
                              f"encoder (--{slot}-model-type)")
        frozen = (freeze.language_model if slot is None else
                  slot in (freeze.projectors if module.endswith("_projection")
                           else freeze.encoders))
        if frozen:
            raise ConfigError(f"{FREEZE_FLAGS[module]} would freeze the LoRA adapters of "
                              f"{module} too: drop it (LoRA freezes the base weights of the "
                              f"modules it adapts)")
    moe = model_config.language.moe
    mlp = {"gate_proj", "up_proj", "down_proj"} & set(targets.get("language_model", ()))
    if moe is not None and mlp:
        raise ConfigError(f"--lora-target-modules {', '.join(sorted(mlp))}: LoRA on the "
                          f"experts of an MoE LLM is not supported (Megatron-Core's "
                          f"grouped expert GEMMs have no per-linear hook); adapt the "
                          f"attention only: --lora-target-modules q_proj k_proj v_proj o_proj")
    return LoraConfig(targets=tuple(targets.items()), rank=config.model.lora_rank,
                      alpha=config.model.lora_alpha, dropout=config.model.lora_dropout)


LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules")

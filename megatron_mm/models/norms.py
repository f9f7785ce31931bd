"""A torch LayerNorm / RMSNorm that runs under sequence parallelism (the local specs' norm).

Megatron-Core's ``WrappedTorchNorm`` refuses ``sequence_parallel``: under it a norm sees
only this rank's share of the sequence, so each TP rank's weight gradient is a partial sum.
Megatron-Core's TE and Apex norms mark their weights ``sequence_parallel`` and its
``finalize_model_grads`` then all-reduces those gradients over the TP group; this norm
does the same, so the local specs can run ``--sequence-parallel`` on any device.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

NORMS = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}


class ZeroCenteredRMSNorm(torch.nn.RMSNorm):
    """RMSNorm scaling by 1 + weight (weight starts at 0): Megatron-Core's
    ``layernorm_zero_centered_gamma`` (Megatron-LM's --apply-layernorm-1p), Qwen3.5's norms."""

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.rms_norm(x.float(), self.normalized_shape, None, self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class SequenceParallelNorm:
    """Builds ``torch.nn.LayerNorm`` or ``torch.nn.RMSNorm`` (``config.normalization``), its
    parameters marked ``sequence_parallel = config.sequence_parallel`` (called like
    ``WrappedTorchNorm``, so it fits any ``ModuleSpec`` norm slot)."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5,
                persist_layer_norm: bool = False, zero_centered_gamma: bool = False,
                normalization: str = "LayerNorm") -> torch.nn.Module:
        for flag in ("persist_layer_norm", "memory_efficient_layer_norm"):
            if getattr(config, flag, False):
                raise ValueError(f"{flag} is not supported by the torch norm")
        if config.normalization not in NORMS:
            raise ValueError(f"normalization {config.normalization!r}: the torch norm knows "
                             f"{sorted(NORMS)}")
        kind = NORMS[config.normalization]
        if getattr(config, "layernorm_zero_centered_gamma", False):
            if config.normalization != "RMSNorm":
                raise ValueError("layernorm_zero_centered_gamma: the torch norm has it for "
                                 "RMSNorm only")
            kind = ZeroCenteredRMSNorm
        norm = kind(hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm

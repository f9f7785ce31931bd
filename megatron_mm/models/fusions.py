"""Megatron-LM's kernel fusions (its flags, defaults and meanings), on where their kernels
exist.

Megatron-LM turns each fusion on by default (``--no-*-fusion`` turns it off) and expects
its kernels to be there (an NGC container: Transformer Engine and Apex). Here each is on
only where its kernel exists, on CUDA; without CUDA every module runs Megatron-Core's plain
ops, as it always did:

- ``bias_dropout_fusion`` (``--no-bias-dropout-fusion``): bias + dropout + residual in one
  ``jit_fuser`` (torch.compile) function of Megatron-Core; a kernel on CUDA.
- ``bias_activation_fusion``: ``--no-bias-swiglu-fusion`` for SwiGLU (the LLM, the
  Qwen2.5-VL tower), ``--no-bias-gelu-fusion`` for GELU. Megatron-Core's ``bias_gelu``
  kernel computes GELU's tanh approximation, so it fuses only modules whose GELU is that
  one (SigLIP's ``gelu_pytorch_tanh``, declared as ``F.gelu``, which Megatron-Core's MLP
  routes to the kernel); exact-GELU modules (Whisper, the MLP projectors) and CLIP's
  ``quick_gelu`` (no kernel without a gated unit) stay unfused rather than change function.
- ``apply_rope_fusion`` (``--no-rope-fusion``): Transformer Engine's fused RoPE through
  Megatron-Core (``rope_utils.fused_apply_rotary_pos_emb``), for the LLM's 1-D RoPE
  (Megatron-Core's fused path takes no M-RoPE batch > 1).
- ``masked_softmax_fusion`` (``--no-masked-softmax-fusion``): the local attention's fused
  scale-mask-softmax, Apex's ``scaled_*masked_softmax_cuda`` kernels (used where their
  shape rules allow; TE's attention has its own).
- ``gradient_accumulation_fusion`` (``--no-gradient-accumulation-fusion``): weight-gradient
  GEMMs accumulate into DDP's ``main_grad``. Megatron-Core's own linears need Apex's
  ``fused_weight_gradient_mlp_cuda`` (``ColumnParallelLinear`` refuses to build without
  it), TE's linears bring their own; the LLM always holds Megatron-Core's output layer.
  Off under ``--fp8-emulation``, whose quantised weight is not the parameter holding
  ``main_grad``.

``persist_layer_norm`` stays off: it selects Apex's ``FusedLayerNorm`` kernel, which no
spec here builds (local norms are ours, TE brings ``TENorm``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping, Tuple

import torch
import torch.nn.functional as F

_APEX_SOFTMAX = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
                 "scaled_softmax_cuda")


@dataclass(frozen=True)
class Kernels:
    """Which fused kernels this process can run."""

    cuda: bool = False
    transformer_engine: bool = False  # TE imports
    apex_wgrad: bool = False  # Apex's fused_weight_gradient_mlp_cuda
    apex_softmax: bool = False  # Apex's scaled_*masked_softmax_cuda
    fused_rope: bool = False  # Megatron-Core's rope_utils.fused_apply_rotary_pos_emb

    @classmethod
    def probe(cls) -> "Kernels":
        if not torch.cuda.is_available():
            return cls()
        from megatron.core.models.common.embeddings import rope_utils
        from megatron.core.tensor_parallel import layers

        from .specs import transformer_engine_importable

        return cls(cuda=True, transformer_engine=transformer_engine_importable(),
                   # what ColumnParallelLinear itself checks before it builds
                   apex_wgrad=layers._grad_accum_fusion_available,
                   apex_softmax=all(_imports(m) for m in _APEX_SOFTMAX),
                   fused_rope=rope_utils.fused_apply_rotary_pos_emb is not None)


def partial_tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """SigLIP's ``gelu_pytorch_tanh``: the function Megatron-Core's ``bias_gelu`` kernel
    computes."""
    return F.gelu(x, approximate="tanh")


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Fusions:
    """The fusions each module's ``TransformerConfig`` gets. All off (the default): the
    plain ops, as without CUDA."""

    bias_dropout: bool = False
    bias_swiglu: bool = False
    bias_gelu_tanh: bool = False
    rope: bool = False
    masked_softmax: bool = False
    # gradient-accumulation fusion in modules holding Megatron-Core's own linears (Apex's
    # kernel), and in modules of TE linears only (TE's kernel)
    wgrad_megatron_linears: bool = False
    wgrad_te_linears: bool = False
    off: Tuple[str, ...] = field(default=(), compare=False)  # why each is off, for the log

    def config_fields(self, rope: bool, te_linears_only: bool) -> dict:
        """``rope``: the module rotates with Megatron-Core's 1-D RoPE (the LLM's)."""
        return dict(
            bias_dropout_fusion=self.bias_dropout,
            masked_softmax_fusion=self.masked_softmax,
            apply_rope_fusion=self.rope and rope,
            gradient_accumulation_fusion=(self.wgrad_te_linears if te_linears_only
                                          else self.wgrad_megatron_linears),
        )

    def activation(self, func: Callable, gated: bool) -> dict:
        """``activation_func`` and ``bias_activation_fusion`` of a module whose MLP applies
        ``func`` (the same function either way)."""
        if gated and func is F.silu and self.bias_swiglu:
            return dict(activation_func=func, bias_activation_fusion=True)
        if not gated and func is partial_tanh_gelu and self.bias_gelu_tanh:
            return dict(activation_func=F.gelu, bias_activation_fusion=True)  # = bias_gelu
        return dict(activation_func=func, bias_activation_fusion=False)

    def describe(self) -> str:
        on = [name for name, value in (
            ("bias-dropout", self.bias_dropout), ("bias-swiglu", self.bias_swiglu),
            ("bias-gelu (tanh GELU modules)", self.bias_gelu_tanh), ("rope", self.rope),
            ("masked-softmax", self.masked_softmax),
            ("gradient-accumulation", self.wgrad_megatron_linears),
            ("gradient-accumulation (TE-linear modules)",
             self.wgrad_te_linears and not self.wgrad_megatron_linears)) if value]
        return ("fusions: " + (", ".join(on) if on else "none")
                + "".join(f"; {reason}" for reason in self.off))


def choose_fusions(flags: Mapping[str, bool], kernels: Kernels, transformer_impl: str,
                   fp8_emulation: bool = False) -> Fusions:
    """Megatron-LM's fusions (``flags``: the dests of its ``--no-*-fusion`` flags,
    ``training/fusion_args.py``, True unless turned off) where their kernels exist. Pure:
    the machine comes in as ``kernels``."""
    if not kernels.cuda:
        return Fusions(off=("no CUDA: Megatron-Core's plain ops",))
    off = []
    te_impl = transformer_impl == "transformer_engine"
    rope = flags["apply_rope_fusion"] and kernels.fused_rope
    if flags["apply_rope_fusion"] and not kernels.fused_rope:
        off.append("rope off: Transformer Engine's fused RoPE does not import")
    softmax = flags["masked_softmax_fusion"] and kernels.apex_softmax
    if flags["masked_softmax_fusion"] and not kernels.apex_softmax and not te_impl:
        off.append("masked-softmax off: Apex's scaled_masked_softmax_cuda is not installed")
    wgrad = flags["gradient_accumulation_fusion"] and not fp8_emulation
    if flags["gradient_accumulation_fusion"] and fp8_emulation:
        off.append("gradient-accumulation off: --fp8-emulation quantises a copy of each "
                   "weight, not the parameter holding main_grad")
    elif wgrad and not kernels.apex_wgrad:
        off.append("gradient-accumulation off in Megatron-Core's linears (the LLM's output "
                   "layer" + ("" if te_impl else ", every local layer")
                   + "): Apex's fused_weight_gradient_mlp_cuda is not installed")
    return Fusions(
        bias_dropout=flags["bias_dropout_fusion"],
        bias_swiglu=flags["bias_swiglu_fusion"],
        bias_gelu_tanh=flags["bias_gelu_fusion"],
        rope=rope,
        masked_softmax=softmax,
        wgrad_megatron_linears=wgrad and kernels.apex_wgrad,
        wgrad_te_linears=wgrad and te_impl and kernels.transformer_engine,
        off=tuple(off),
    )

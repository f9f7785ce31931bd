"""FP8 EMULATION (``--fp8-emulation``): Transformer Engine's FP8 numerics, not Transformer
Engine, in Megatron-Core's local parallel linear layers on any device.

A numerics check for machines without TE (CPU): each GEMM of an FP8 module quantises its
inputs and weights to E4M3 in forward and its output gradient to E5M2 (hybrid) or E4M3
(e4m3) in backward, then dequantises and multiplies in the model's precision. What it
reproduces of TE (transformer_engine/pytorch/quantization.py, module/linear.py,
common/recipe/delayed_scaling.cu, tests/pytorch/test_recipe.py and
tests/pytorch/references/quantize_scale_calc.py):

- FP8 only inside an enabled autocast (``fp8_state.EmulatedAutocast``), entered where
  Megatron-Core's ``get_fp8_context`` enters TE's: around an FP8 ``TransformerBlock`` and
  an FP8 ``MultimodalProjector`` (hooks here), and wherever ``fp8_context`` is used;
- the cast: ``x * scale`` saturated to the format's largest finite value, rounded to FP8,
  dequantised with ``1 / scale``;
- delayed scaling: each tensor's amax goes into slot 0 of its amax history (the max of
  every cast since the last update); the process-wide buffers, their reduction over the
  amax reduction group (Megatron-Core's ``get_amax_reduction_group``: TP x DP x CP, or
  TP x CP with ``tp_only_amax_red``) and when it happens are ``fp8_state``'s; the update
  rolls the history by one, zeroes slot 0 and sets
  ``scale = fp8_max / amax / 2**margin`` with amax the newest (``most_recent``) or the
  largest in the window (``max``); a zero amax leaves history and scale as they were, an
  infinite or NaN amax keeps the scale, a scale that overflows becomes FP32's max;
- the FP8 weight cache (TE ``Linear.forward`` / ``quantize_weight``; Megatron-Core's TE
  layers pass their ``is_first_microbatch`` and clear it after each forward): the weight
  is quantised (and its amax recorded) when ``is_first_microbatch`` is True or None, else
  the cached FP8 weight is reused, until ``set_is_first_microbatch`` sets it again;
- current scaling (``tensorwise``): ``scale = fp8_max / amax`` of the tensor itself (no
  margin); amax 0 gives scale 1. Amaxes are local, except the input of a column-parallel
  and the output gradient of a row-parallel layer under sequence parallelism, which are
  max-reduced over the TP group (TE quantises them before its all-gather);
- bias gradients from the unquantised output gradient (TE fuses them into its cast);
- TE's shape check of each FP8 GEMM (``plan.fp8.fp8_gemm_dims_error``) on the input as
  this rank holds it (under sequence parallelism a column-parallel layer's local shard,
  before the all-gather, as TE's ``_Linear`` checks it) and on the weight shard: a
  ``ValueError`` with TE's message where TE would raise one.

GEMMs accumulate in the model's precision, not in tensor cores' FP32 accumulators.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.fp8_utils import is_first_last_bf16_layer
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_block import TransformerBlock

from ..plan.fp8 import EMULATED_RECIPES, FP8_MAX, fp8_dtypes, fp8_gemm_dims_error
from . import fp8_state
from .interleaved_blocks import InterleavedBlocks
from .fp8_scaling import FP32_MAX

TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def quantize_dequantize(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """TE's FP8 cast and back: saturate ``x * scale`` to +-fp8_max (TE's casts are
    satfinite; torch's E5M2 cast would overflow to inf), round to FP8, multiply by
    ``1 / scale``. Returned in ``x``'s dtype."""
    limit = FP8_MAX[fmt]
    q = (x.float() * scale).clamp(-limit, limit).to(TORCH_FP8[fmt])
    return (q.float() * torch.reciprocal(scale)).to(x.dtype)


def amax(x: torch.Tensor) -> torch.Tensor:
    return x.detach().abs().amax().float()


def current_scale(amax_value: torch.Tensor, fmt: str) -> torch.Tensor:
    """TE's current (tensorwise) scaling: fp8_max / amax, FP32's max where that
    overflows, 1 where amax is 0 (TE's reference ``scale_from_amax_tensor``, eps 0, no
    power-of-2 rounding: Float8CurrentScaling's defaults)."""
    scale = FP8_MAX[fmt] / amax_value
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FP32_MAX), scale)
    return torch.where(amax_value == 0, torch.ones_like(scale), scale)


class DelayedScalingMeta:
    """Amax history and scales of a group of tensors (TE's ``fp8_meta`` of one direction:
    forward = [input, weight], backward = [output gradient])."""

    def __init__(self, num_tensors: int, history_len: int, fmt: str,
                 device: Optional[torch.device] = None):
        # On the weight's device, as TE allocates its fp8_meta: made on the host and moved at
        # the first cast, it cost a blocking copy inside step 1 (seen on an H100).
        self.fmt = fmt
        self.amax_history = torch.zeros(history_len, num_tensors, device=device)
        self.scale = torch.ones(num_tensors, device=device)

    def to(self, device: torch.device) -> "DelayedScalingMeta":
        """Moved with a model built on the host (--use-cpu-initialization): the tensors are
        new and never written on the host again, so the copy need not block."""
        if self.scale.device != device:
            self.amax_history = self.amax_history.to(device, non_blocking=True)
            self.scale = self.scale.to(device, non_blocking=True)
        return self

    def record(self, i: int, value: torch.Tensor) -> None:
        """Slot 0 holds the max of every amax since the last update (TE's cast kernels
        max their amax into it)."""
        self.amax_history[0, i] = torch.maximum(self.amax_history[0, i], value)


class _QuantizeForward(torch.autograd.Function):
    """Quantise-dequantise in forward; the gradient passes straight through (TE computes
    gradients with respect to the high-precision tensor from the quantised GEMM)."""

    @staticmethod
    def forward(ctx, x, scale, fmt):
        return quantize_dequantize(x, scale, fmt)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _CachedWeight(torch.autograd.Function):
    """The cached FP8 weight in forward; the gradient passes straight to the weight."""

    @staticmethod
    def forward(ctx, weight, cached):
        return cached.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _QuantizeGradOutput(torch.autograd.Function):
    """Identity in forward; the output gradient quantised by ``emu`` in backward."""

    @staticmethod
    def forward(ctx, y, emu):
        ctx.emu = emu
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return ctx.emu.quantize_grad_output(grad), None


class Fp8LinearEmulation:
    """One linear layer's FP8 state and casts, from its ``TransformerConfig``."""

    INPUT, WEIGHT = 0, 1

    def __init__(self, linear: torch.nn.Module, parallel_mode: str):
        config = linear.config
        if config.fp8_recipe not in EMULATED_RECIPES:
            raise ValueError(f"--fp8-emulation emulates the {' and '.join(EMULATED_RECIPES)} "
                             f"recipes, not {config.fp8_recipe}")
        self.linear = linear
        self.parallel_mode = parallel_mode  # "column" or "row"
        self.recipe = config.fp8_recipe
        self.fwd_fmt, self.bwd_fmt = fp8_dtypes(config.fp8)
        self.cached_weight: Optional[torch.Tensor] = None  # TE's FP8 weight workspace
        self.weight_casts = 0  # how often the weight was quantised (its cache refreshed)
        if self.recipe == "delayed":
            device = getattr(linear, "weight", None)
            device = None if device is None else device.device
            self.fwd = DelayedScalingMeta(2, config.fp8_amax_history_len, self.fwd_fmt, device)
            self.bwd = DelayedScalingMeta(1, config.fp8_amax_history_len, self.bwd_fmt, device)

    def _sp_gathered(self, mode: str):
        """The TP group when this tensor is all-gathered under sequence parallelism."""
        if getattr(self.linear, "sequence_parallel", False) and self.parallel_mode == mode:
            return self.linear.tp_group
        return None

    def _current(self, x: torch.Tensor, fmt: str, group=None) -> torch.Tensor:
        value = amax(x)
        if group is not None and torch.distributed.get_world_size(group) > 1:
            torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=group)
        return current_scale(value, fmt)

    def quantize_forward(self, x: torch.Tensor, weight: torch.Tensor,
                         is_first_microbatch: Optional[bool]):
        delayed = self.recipe == "delayed"
        if delayed:
            self.fwd.to(x.device)
            fp8_state.register({True: self.fwd, False: self.bwd}, self)
            # Cast with the scale from earlier updates, then record this cast's amax.
            sx = self.fwd.scale[self.INPUT].clone()
            self.fwd.record(self.INPUT, amax(x))
        else:
            sx = self._current(x, self.fwd_fmt, self._sp_gathered("column"))
        qx = _QuantizeForward.apply(x, sx, self.fwd_fmt)
        if is_first_microbatch is False and self.cached_weight is not None:
            return qx, _CachedWeight.apply(weight, self.cached_weight)
        if delayed:
            sw = self.fwd.scale[self.WEIGHT].clone()
            self.fwd.record(self.WEIGHT, amax(weight))
        else:
            sw = self._current(weight, self.fwd_fmt)
        qw = _QuantizeForward.apply(weight, sw, self.fwd_fmt)
        self.weight_casts += 1
        if is_first_microbatch is not None:
            self.cached_weight = qw.detach()
        return qx, qw

    def quantize_grad_output(self, grad: torch.Tensor) -> torch.Tensor:
        if self.recipe == "tensorwise":
            scale = self._current(grad, self.bwd_fmt, self._sp_gathered("row"))
        else:
            scale = self.bwd.to(grad.device).scale[0].clone()
            self.bwd.record(0, amax(grad))
        return quantize_dequantize(grad, scale, self.bwd_fmt)


class _EmulatedFp8Linear:
    """Mixin over Megatron-Core's parallel linears: inside an enabled autocast their GEMM
    (``_forward_impl``, which also does the TP communication) sees quantised inputs and
    weights and hands back a quantised output gradient; the bias is added outside the
    GEMM. ``is_first_microbatch`` as on Megatron-Core's TE linears: passed to the cast,
    then cleared."""

    fp8_emulation: Fp8LinearEmulation
    is_first_microbatch: Optional[bool] = True

    def _forward_impl(self, input, weight, bias=None, **kwargs):
        if not fp8_state.fp8_enabled():  # TE runs its modules in high precision there
            return super()._forward_impl(input=input, weight=weight, bias=bias, **kwargs)
        for operand in (input, weight):  # TE's _Linear: assert_dim_for_fp8_exec(inputmat, weight)
            error = fp8_gemm_dims_error(tuple(operand.shape), self.fp8_emulation.recipe)
            if error is not None:
                raise ValueError(error)
        first, self.is_first_microbatch = self.is_first_microbatch, False
        x, w = self.fp8_emulation.quantize_forward(input, weight, first)
        if torch.is_grad_enabled() and (w.requires_grad or x.requires_grad):
            if fp8_state.take_first_module():  # its backward ends with the reduction
                if w.requires_grad:
                    w = fp8_state.ReduceAfterBackward.apply(w)
                else:
                    x = fp8_state.ReduceAfterBackward.apply(x)
        out = super()._forward_impl(input=x, weight=w, bias=None, **kwargs)
        out = _QuantizeGradOutput.apply(out, self.fp8_emulation)
        return out if bias is None else out + bias


class Fp8EmulatedColumnParallelLinear(_EmulatedFp8Linear, ColumnParallelLinear):
    pass


class Fp8EmulatedRowParallelLinear(_EmulatedFp8Linear, RowParallelLinear):
    pass


_EMULATED = {ColumnParallelLinear: (Fp8EmulatedColumnParallelLinear, "column"),
             RowParallelLinear: (Fp8EmulatedRowParallelLinear, "row")}


def emulate_linears(module: torch.nn.Module) -> int:
    count = 0
    for sub in module.modules():
        if type(sub) not in _EMULATED:
            continue
        if sub.gradient_accumulation_fusion:
            raise ValueError("--fp8-emulation needs gradient_accumulation_fusion off (the "
                             "quantised weight is not the parameter holding main_grad)")
        cls, mode = _EMULATED[type(sub)]
        sub.__class__ = cls
        sub.fp8_emulation = Fp8LinearEmulation(sub, mode)
        sub.is_first_microbatch = True
        count += 1
    return count


def amax_reduction_group(config):
    """Megatron-Core's amax reduction group, as its ``get_fp8_context`` passes it to TE
    (None before the model-parallel groups exist: TE then reduces over the world)."""
    if not parallel_state.model_parallel_is_initialized():
        return None
    return parallel_state.get_amax_reduction_group(
        with_context_parallel=True, tp_only_amax_red=config.tp_only_amax_red)


def emulated_autocast(config) -> fp8_state.EmulatedAutocast:
    """What Megatron-Core's ``get_fp8_context(config)`` returns with TE, emulated."""
    return fp8_state.EmulatedAutocast(True, fp8_state.Recipe.of(config),
                                      amax_reduction_group(config))


def is_emulated(config) -> bool:
    """Whether ``config``'s modules run FP8 in the emulation (``emulate_fp8`` marks it)."""
    return bool(getattr(config, "fp8_emulation", False))


def attach_autocast(module: torch.nn.Module) -> None:
    """Run every forward of ``module`` inside its config's emulated autocast, where
    Megatron-Core's code enters TE's (``TransformerBlock.forward``,
    ``MultimodalProjector.forward``)."""
    module.config.fp8_emulation = True
    active: List[fp8_state.EmulatedAutocast] = []

    def enter(mod, args):
        active.append(emulated_autocast(mod.config))
        active[-1].__enter__()

    def leave(mod, args, output):
        active.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


def emulate_fp8(model: torch.nn.Module) -> List[str]:
    """Give every linear layer that TE would run in FP8 the emulated casts: the layers of a
    ``TransformerBlock`` (or an interleaved encoder's ``InterleavedBlocks``, whose blocks
    are no submodules) whose config has ``fp8`` (except Megatron-Core's first/last BF16
    layers) and the linears of an FP8 ``MultimodalProjector`` (both enter
    ``get_fp8_context`` on their own config, here the emulated autocast). Embeddings and
    the output layer stay in high precision, as with TE. Starts a fresh FP8 state (the
    buffers of earlier models dropped). Returns a line per converted module, for the log."""
    done: List[str] = []
    for name, module in model.named_modules():
        if isinstance(module, (TransformerBlock, InterleavedBlocks)) and module.config.fp8:
            fp8_layers = [layer for layer in module.layers
                          if not is_first_last_bf16_layer(module.config,
                                                          layer.layer_number - 1)]
            n = sum(emulate_linears(layer) for layer in fp8_layers)
            attach_autocast(module)
            done.append(f"{name}: {n} linears in layers "
                        f"{[layer.layer_number for layer in fp8_layers]}")
        elif isinstance(module, MultimodalProjector) and module.config.fp8:
            done.append(f"{name}: {emulate_linears(module)} linears")
            attach_autocast(module)
    fp8_state.reset_fp8_state()
    return done


def emulated_linears(model: torch.nn.Module) -> List[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, _EmulatedFp8Linear)]


def delayed_meta(linear: torch.nn.Module, forward: bool = True) -> Optional[DelayedScalingMeta]:
    emu = linear.fp8_emulation
    return None if emu.recipe != "delayed" else (emu.fwd if forward else emu.bwd)

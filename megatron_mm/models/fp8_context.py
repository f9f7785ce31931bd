"""FP8 where our own code runs modules (encoder pieces, idle runs, layer profiles): the
context Megatron-Core's ``get_fp8_context`` gives (Transformer Engine's ``fp8_autocast``)
or, for ``--fp8-emulation``, the emulated one; TE's checkpoint for FP8 recompute.

Delayed scaling reduces amaxes at autocast exits and in backward (``fp8_state``): for the
ranks of an amax reduction group to issue the same collectives, every FP8 module enters
and leaves its autocast on every micro-batch, with or without media (an idle run on
zeros, ``MultimodalModel``), and
a frozen module leaves it with gradients enabled when training (TE skips the reduction
and the scale update otherwise: its scales would stay at 1 for good).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from megatron.core import fp8_utils, tensor_parallel

from .fp8_emulation import emulated_autocast, is_emulated


def get_fp8_context(config, layer_no: int = -1):
    """Megatron-Core's ``get_fp8_context(config, layer_no)``; the emulated autocast for a
    config ``emulate_fp8`` marked."""
    if config.fp8 and is_emulated(config):
        return emulated_autocast(config)
    return fp8_utils.get_fp8_context(config, layer_no)


def runs_te_fp8(config) -> bool:
    """Whether modules of ``config`` run FP8 in Transformer Engine (not the emulation)."""
    return bool(config.fp8) and not is_emulated(config)


def reduces_amax(config) -> bool:
    """Delayed scaling: amaxes reduced at autocast exits, so its enter/exit count must not
    depend on the data."""
    return bool(config.fp8) and getattr(config.fp8_recipe, "value", config.fp8_recipe) \
        == "delayed"


@contextmanager
def fp8_region(config, training: bool):
    """One outermost FP8 autocast around a module's run (delayed scaling), entered and left
    with gradients enabled when ``training`` whatever the run inside: a frozen module's
    amaxes are then reduced and its scales updated like any other's."""
    if not reduces_amax(config):
        yield
        return
    grad = torch.is_grad_enabled()
    with torch.set_grad_enabled(grad or training), get_fp8_context(config), \
            torch.set_grad_enabled(grad):
        yield


def checkpoint(run, config, tp_group, hidden: torch.Tensor) -> torch.Tensor:
    """Recompute ``run(hidden)`` in backward: TE's checkpoint for modules running TE FP8 (it
    restores the FP8 scaling state for the recomputed forward; Megatron-Core's
    ``checkpointed_forward`` chooses it the same way), else ``tensor_parallel.checkpoint``."""
    if runs_te_fp8(config):
        from megatron.core.extensions.transformer_engine import te_checkpoint

        return te_checkpoint(run, config.distribute_saved_activations,
                             tensor_parallel.random.get_cuda_rng_tracker, tp_group, hidden)
    return tensor_parallel.checkpoint(run, config.distribute_saved_activations, hidden)


def _forward_amaxes(module):
    """(module, slot 0 of its forward amax history, which columns hold weights) for every
    delayed-scaling FP8 module in ``module``: TE's ``fp8_meta["scaling_fwd"]`` (input,
    weight, output per GEMM: ``FP8FwdTensors``), or the emulation's [input, weight]."""
    for m in module.modules():
        emu = getattr(m, "fp8_emulation", None)
        meta = getattr(m, "fp8_meta", None)
        if emu is not None and emu.recipe == "delayed":
            history, per_gemm = emu.fwd.amax_history, 2
        elif isinstance(meta, dict) and "scaling_fwd" in meta and hasattr(
                meta["scaling_fwd"], "amax_history"):
            history, per_gemm = meta["scaling_fwd"].amax_history, 3
        else:
            continue
        columns = torch.arange(history.shape[1], device=history.device)
        yield m, history[0], columns % per_gemm == 1


@contextmanager
def idle_run(module, training: bool):
    """An FP8 module's run on zeros for a micro-batch without its media: inside one
    outermost autocast as a real run (the same reductions on every rank), its activation
    amaxes dropped before that autocast reduces them (what zeros make of biases and norms
    is not data: a rank without media then changes no scale, as one process would not).
    Weight amaxes stay: the weight is what a real run casts."""
    with fp8_region(module.config, training):
        before = {m: row.clone() for m, row, _ in _forward_amaxes(module)}
        yield
        for m, row, weights in _forward_amaxes(module):
            old = before.get(m, torch.zeros_like(row))
            row.copy_(torch.where(weights, row, old))


class _Anchor(torch.autograd.Function):
    """``text`` unchanged; in backward the idle outputs get zero gradients, so their
    modules' backward (and TE's backward amax reduction) runs as for real media."""

    @staticmethod
    def forward(ctx, text, *idle):
        ctx.shapes = [(t.shape, t.dtype, t.device) for t in idle]
        return text.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad, *(torch.zeros(s, dtype=d, device=v) for s, d, v in ctx.shapes))


def anchor(text: torch.Tensor, idle: torch.Tensor) -> torch.Tensor:
    """``text``, with ``idle``'s backward joined to it (when ``idle`` has one)."""
    if not (torch.is_grad_enabled() and idle.requires_grad):
        return text
    return _Anchor.apply(text, idle)

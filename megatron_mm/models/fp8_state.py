"""Transformer Engine's process-wide FP8 state, emulated for ``--fp8-emulation``
(transformer_engine/pytorch/quantization.py, ``FP8GlobalStateManager`` and ``autocast``;
module/base.py ``prepare_forward``; module/linear.py ``_Linear.backward``).

What can make ranks issue different collectives, reproduced so that the CPU suite sees it:

- one global amax buffer per (direction, recipe, amax reduction group): a delayed-scaling
  module joins it on its first forward inside an autocast, for good;
- on leaving the OUTERMOST enabled autocast with gradients enabled, every forward buffer
  is max-reduced over its group (one all-reduce per buffer, whatever ran inside) and each
  module's history rolls and scale updates;
- in backward, the first FP8 module of an outermost autocast (the last to run backward)
  that has a gradient to compute reduces and updates every backward buffer.

So a rank whose micro-batch skips a module's autocast (no media) makes fewer all-reduces
than its peers, or reduces buffers of another length: a hang on NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from ..plan.fp8 import FP8_MAX
from .fp8_scaling import amax_update


@dataclass(frozen=True)
class Recipe:
    """The fields of TE's recipe that key its buffers and drive the update."""

    kind: str  # delayed | tensorwise
    fmt: str  # e4m3 | hybrid
    margin: int = 0
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"

    @classmethod
    def of(cls, config) -> "Recipe":
        kind = getattr(config.fp8_recipe, "value", config.fp8_recipe)
        return cls(kind, config.fp8, config.fp8_margin, config.fp8_amax_history_len,
                   config.fp8_amax_compute_algo)

    @property
    def delayed(self) -> bool:
        return self.kind == "delayed"


class _State:
    def __init__(self):
        self.generation = 0
        self.reset()

    def reset(self) -> None:
        self.generation += 1  # modules registered before join again on their next forward
        self.depth = 0
        self.enabled = False
        self.recipe: Optional[Recipe] = None
        self.group = None
        self.first_module = False
        # forward -> key -> the modules' scaling metas, in registration order
        self.buffers: Dict[bool, Dict[Tuple, list]] = {True: {}, False: {}}
        self.arguments: Dict[Tuple, Tuple[Recipe, object]] = {}


STATE = _State()


def reset_fp8_state() -> None:
    """Forget every buffer (TE: ``FP8GlobalStateManager.reset``), as for a new model."""
    STATE.reset()


def fp8_enabled() -> bool:
    return STATE.enabled


def register(metas: Dict[bool, object], owner) -> None:
    """A delayed-scaling module's ``{forward: meta}`` joins the buffers of the current
    autocast's recipe and group, once (TE: ``add_fp8_tensors_to_global_buffer``)."""
    if getattr(owner, "_fp8_generation", None) == STATE.generation:
        return
    owner._fp8_generation = STATE.generation
    key = (STATE.recipe, id(STATE.group))
    STATE.arguments[key] = (STATE.recipe, STATE.group)
    for forward, meta in metas.items():
        STATE.buffers[forward].setdefault(key, []).append(meta)


def take_first_module() -> bool:
    """True for the first FP8 module with gradients of an outermost autocast
    (TE: ``is_first_fp8_module``): it reduces the backward buffers after its backward."""
    first, STATE.first_module = STATE.first_module, False
    return first


def reduce_and_update(forward: bool) -> None:
    """Every buffer of one direction: amaxes max-reduced over the group (one all-reduce per
    buffer), then each module's history and scale updated (TE:
    ``reduce_and_update_fp8_tensors``)."""
    for key, metas in STATE.buffers[forward].items():
        recipe, group = STATE.arguments[key]
        newest = torch.cat([m.amax_history[0] for m in metas])
        reduce_max(newest, group)
        for meta, part in zip(metas, newest.split([m.amax_history.shape[1] for m in metas])):
            meta.amax_history[0] = part
            amax_update(meta.amax_history, meta.scale, FP8_MAX[meta.fmt],
                        recipe.amax_compute_algo, recipe.margin)


def reduce_max(amaxes: torch.Tensor, group) -> None:
    """TE's ``reduce_tensor_across_group_op_max``, where the group has more than one rank."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size(group) > 1:
        torch.distributed.all_reduce(amaxes, op=torch.distributed.ReduceOp.MAX, group=group)


class EmulatedAutocast:
    """TE's ``autocast(enabled, recipe, amax_reduction_group)``: saves and restores the
    state around its region; leaving the outermost enabled one with gradients enabled
    reduces and updates the forward buffers."""

    def __init__(self, enabled: bool, recipe: Optional[Recipe], group=None):
        self.enabled, self.recipe, self.group = enabled, recipe, group
        self.saved: List[tuple] = []

    def __enter__(self) -> "EmulatedAutocast":
        self.saved.append((STATE.enabled, STATE.recipe, STATE.group, STATE.first_module))
        STATE.enabled, STATE.recipe, STATE.group = self.enabled, self.recipe, self.group
        if STATE.depth == 0:
            STATE.first_module = True
        STATE.depth += 1
        return self

    def __exit__(self, *exc) -> None:
        STATE.enabled, STATE.recipe, STATE.group, STATE.first_module = self.saved.pop()
        STATE.depth -= 1
        if self.enabled and STATE.depth == 0 and torch.is_grad_enabled():
            reduce_and_update(forward=True)


class ReduceAfterBackward(torch.autograd.Function):
    """Identity; its backward (after the GEMM that consumed the tensor) reduces and
    updates the backward buffers (TE: the end of the first FP8 module's backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        reduce_and_update(forward=False)
        return grad

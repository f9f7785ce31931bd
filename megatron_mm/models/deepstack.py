"""DeepStack (Qwen3-VL): vision features taken from intermediate encoder layers are added
to the LLM's hidden state at the visual positions after each of its first decoder layers
(feature ``i`` after layer ``i``).

The LLM stays Megatron-Core's ``TransformerBlock``: a forward hook on each of those layers
(``DeepStack.attach``) adds the bound features to the layer's output hidden state, so the
block, its recompute and its pipeline layout are unchanged. What a micro-batch adds is one
``DeepStackFeatures`` record (the flat [S, B] positions and one [n, H] tensor per layer),
bound before the LLM runs and cleared after: the record, not the module, is what a later
pipeline plan carries to the stage holding those layers.

The layers add leaf copies of the features, joined to the LLM's input (``join``): that
node's backward runs after every layer's (the layers follow the input) and hands the
features the gradients their leaves gathered. So the gradient reaches the mergers once,
in the outer backward, also when Megatron-Core's activation recompute re-runs the layers
(and their hooks) inside its own backward. A pipeline schedule runs other micro-batches'
forwards (binding theirs) before that backward, so the chunk's output passes through
``rebind_in_backward``: the first node its backward meets binds this micro-batch's record
again before any layer is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, List, Optional

import torch


@dataclass
class DeepStackFeatures:
    """One micro-batch's DeepStack inputs: ``slots`` [n] long, the flat positions in the
    sequence-first [S, B] hidden state (``BatchLayout.slots``' order), and ``features``,
    one [n, H] tensor per LLM layer that adds them (layer ``i`` adds ``features[i]``; None
    for a layer before the chunk that received them)."""

    slots: torch.Tensor
    features: List[Optional[torch.Tensor]]
    tokens: int  # S x B of the whole hidden state they are added to
    # The layers' hidden state a share of the whole sequence (context- or sequence-
    # parallel): whole [S, B, H] -> this rank's share, split as the LLM's input is
    # (``MultimodalModel.llm_share``); None: the layers hold the whole sequence.
    share: Optional[Callable[[torch.Tensor], torch.Tensor]] = None


class DeepStack:
    """The hooks on the LLM layers numbered (0-based, global) below ``num_layers``, and the
    features they add for the micro-batch bound now."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.bound: Optional[DeepStackFeatures] = None
        self.sent: Optional[DeepStackFeatures] = None  # as made: what a later stage gets
        self.layers: List[int] = []  # this chunk's hooked layers (global, 0-based)

    def attach(self, block) -> None:
        """Hook the layers of ``block`` (a ``TransformerBlock``, this chunk's) that add
        features."""
        for layer in block.layers:
            index = layer.layer_number - 1  # Megatron-Core's: 1-based, pipeline offset in
            if index < self.num_layers:
                layer.register_forward_hook(self._hook(index))
                self.layers.append(index)

    def bind(self, features: Optional[DeepStackFeatures]) -> None:
        if features is None:
            self.sent = None
        if features is not None and len(features.features) != self.num_layers:
            raise ValueError(f"{len(features.features)} DeepStack features for "
                             f"{self.num_layers} LLM layers")
        self.bound = features

    def take_share(self, share: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The bound features go to this rank's share of the sequence only (``share``:
        whole [S, B, H] -> the share the layers hold)."""
        if self.bound is not None:
            self.bound = replace(self.bound, share=share)

    def join(self, hidden: torch.Tensor, features: DeepStackFeatures) -> torch.Tensor:
        """Bind ``features`` (as leaves, when they take gradients; None for layers before
        this chunk's) and return ``hidden``, the LLM's input, joined to their backward."""
        self.sent = features
        given = [f for f in features.features if f is not None]
        if not (torch.is_grad_enabled() and any(f.requires_grad for f in given)):
            self.bind(features)
            return hidden
        leaves = [None if f is None else f.detach().requires_grad_()
                  for f in features.features]
        self.bind(DeepStackFeatures(features.slots, leaves, features.tokens, features.share))
        return _Join.apply(hidden, [leaf for leaf in leaves if leaf is not None], *given)

    def rebind_in_backward(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the chunk's output, computed with the record bound now), whose backward
        binds that record again first."""
        if self.bound is None or not (torch.is_grad_enabled() and out.requires_grad):
            return out
        return _Rebind.apply(out, self, self.bound)

    def _hook(self, index: int):
        def add(module, args, output):
            if self.bound is None:
                return output  # a micro-batch without visual tokens
            hidden, context = output
            s, b, h = hidden.shape
            feature = self.bound.features[index].to(hidden.dtype)
            if self.bound.share is not None:  # this rank's share of the sequence
                whole = hidden.new_zeros(self.bound.tokens, h).index_copy(
                    0, self.bound.slots, feature)
                return hidden + self.bound.share(whole.view(-1, b, h)), context
            if s * b != self.bound.tokens:
                raise ValueError(f"DeepStack features for {self.bound.tokens} positions; LLM "
                                 f"layer {index} holds {s * b} and no share of them was bound")
            added = hidden.reshape(s * b, h).index_add(0, self.bound.slots, feature)
            return added.view(s, b, h), context
        return add


class _Join(torch.autograd.Function):
    """``hidden`` unchanged; in backward each feature gets the gradient its leaf gathered
    in the layers."""

    @staticmethod
    def forward(ctx, hidden, leaves, *features):
        ctx.leaves = leaves
        return hidden.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad, None, *(leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                              for leaf in ctx.leaves))


class _Rebind(torch.autograd.Function):
    """Identity; its backward binds the micro-batch's features for the layers' recompute."""

    @staticmethod
    def forward(ctx, out, deepstack, bound):
        ctx.deepstack, ctx.bound = deepstack, bound
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.deepstack.bind(ctx.bound)
        return grad, None, None

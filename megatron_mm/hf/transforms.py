"""Named tensor transforms between Hugging Face and Megatron-Core layouts.

Each transform maps the Hugging Face tensors of one rule to the one Megatron tensor
(``to_megatron``) and back (``to_hf``); both are exact (only reshapes, concatenation,
zero padding). ``ctx`` carries the few sizes a transform needs (head counts, vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch


@dataclass(frozen=True)
class Context:
    """Sizes a transform needs: per attention stack (``language``, ``vision``) its
    (query heads, key/value groups); the HF vocabulary and the padded one."""

    heads: Dict[str, tuple]
    vocab_size: int = 0
    padded_vocab_size: int = 0


class Transform:
    name = "transform"

    def to_megatron(self, tensors: Sequence[torch.Tensor], ctx: Context) -> torch.Tensor:
        raise NotImplementedError

    def to_hf(self, tensor: torch.Tensor, ctx: Context) -> List[torch.Tensor]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class Identity(Transform):
    name = "identity"

    def to_megatron(self, tensors, ctx):
        return tensors[0]

    def to_hf(self, tensor, ctx):
        return [tensor]


class QKVPerGroup(Transform):
    """q, k, v projections -> Megatron's fused ``linear_qkv``, ordered per key/value group:
    [q heads of group 0, k of group 0, v of group 0, q heads of group 1, ...]. A
    column-parallel split of that tensor gives each TP rank whole groups, which is why
    TP must divide the number of groups. Weights and biases alike (rows are dim 0)."""

    def __init__(self, stack: str):
        self.stack = stack
        self.name = f"qkv_per_group[{stack}]"

    def _sizes(self, rows_q: int, ctx: Context):
        heads, groups = ctx.heads[self.stack]
        head_dim = rows_q // heads
        return groups, heads // groups * head_dim, head_dim

    def to_megatron(self, tensors, ctx):
        q, k, v = tensors
        groups, q_rows, head_dim = self._sizes(q.shape[0], ctx)
        rest = q.shape[1:]
        parts = [q.reshape(groups, q_rows, *rest), k.reshape(groups, head_dim, *rest),
                 v.reshape(groups, head_dim, *rest)]
        return torch.cat(parts, dim=1).reshape(-1, *rest)

    def to_hf(self, tensor, ctx):
        heads, groups = ctx.heads[self.stack]
        head_dim = tensor.shape[0] // (heads + 2 * groups)
        q_rows = heads // groups * head_dim
        rest = tensor.shape[1:]
        grouped = tensor.reshape(groups, q_rows + 2 * head_dim, *rest)
        q, k, v = grouped.split([q_rows, head_dim, head_dim], dim=1)
        return [t.reshape(-1, *rest).contiguous() for t in (q, k, v)]


class QKVBiasWithoutKey(QKVPerGroup):
    """Whisper's q and v biases (its key projection has none) -> the fused QKV bias with a
    zero key bias. Export drops the key bias: it adds q.b to every score of a query, which
    the softmax cancels, so it never affects the output (nor gets a gradient)."""

    def __init__(self, stack: str):
        super().__init__(stack)
        self.name = f"qkv_bias_without_key[{stack}]"

    def to_megatron(self, tensors, ctx):
        q, v = tensors
        return super().to_megatron([q, torch.zeros_like(v), v], ctx)

    def to_hf(self, tensor, ctx):
        q, _, v = super().to_hf(tensor, ctx)
        return [q, v]


class GateUpFusion(Transform):
    """SwiGLU gate and up projections -> Megatron's ``linear_fc1`` = [gate; up]."""

    name = "gate_up_fusion"

    def to_megatron(self, tensors, ctx):
        return torch.cat(list(tensors), dim=0)

    def to_hf(self, tensor, ctx):
        return [t.contiguous() for t in tensor.chunk(2, dim=0)]


class VocabPadding(Transform):
    """Embedding / output rows padded with zeros to Megatron's padded vocabulary (a
    multiple of make-vocab-size-divisible-by x TP); export drops the padding again."""

    name = "vocab_padding"

    def to_megatron(self, tensors, ctx):
        (t,) = tensors
        pad = t.new_zeros(ctx.padded_vocab_size - t.shape[0], *t.shape[1:])
        return torch.cat([t, pad], dim=0)

    def to_hf(self, tensor, ctx):
        return [tensor[:ctx.vocab_size].contiguous()]


class ClassToken(Transform):
    """CLIP's ``class_embedding`` [H] <-> Megatron's ``class_token`` [1, 1, H]."""

    name = "class_token"

    def to_megatron(self, tensors, ctx):
        return tensors[0].reshape(1, 1, -1)

    def to_hf(self, tensor, ctx):
        return [tensor.reshape(-1).contiguous()]


IDENTITY = Identity()
GATE_UP = GateUpFusion()
VOCAB = VocabPadding()
CLASS_TOKEN = ClassToken()

"""FlexAttention (``torch.nn.attention.flex_attention``) as the LLM's core attention for
masks that are not plain causal: bidirectional media items, packed samples, both, and the
context-parallel split (this rank's queries against the keys it gathers).

The ``BlockMask`` is built on the device from the O(S) mask codes
(``plan/context_parallel/attention_mask.py``), never from an S x S matrix: every query row
attends one contiguous key interval ``[lo, hi]`` (``key_intervals``), so a query block's
key tiles are the union of its rows' intervals (a difference array over tiles, as the
planner's ``tile_map``) and a tile is full (no mask evaluation) when it lies inside every
row's interval. Inside partial tiles the kernel evaluates ``mask_mod``, a closure over
small per-token tensors (document and item of each key; position, document and item of
each local query). Memory then grows like S x block, not S x S.

``flex_attention`` runs compiled (``torch.compile``; eagerly it materialises the scores),
with dynamic shapes so that micro-batches of other lengths reuse one kernel. On CPU torch
refuses its backward: there it serves forward-only passes (validation, generation) and CPU
training keeps the local path (``attention_choice.py``). The per-query tensors are padded
to the key length: inductor's CPU template fails to compile a ``mask_mod`` that captures a
tensor sized by the query length when the two lengths differ (torch 2.13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from ..plan.context_parallel.attention_mask import DOC_SHIFT, ITEM_MASK
from .context_parallel import ContextParallelMask
from .cp_attention import ContextParallelAttention

# The BlockMask's tile (query and key): flex_attention's default sparse block.
FLEX_BLOCK = 128

_compiled = torch.compile(flex_attention, dynamic=True)


def compile_count() -> int:
    """Kernels Dynamo holds for ``flex_attention`` in this process (its cache entries on
    the function's code: one per guard set, e.g. per dtype, GQA or not, grad or not). Past
    ``torch._dynamo.config.recompile_limit`` Dynamo would stop compiling it and run it
    eagerly, which materialises the S x S scores: ``_run_compiled`` refuses that."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(flex_attention))


class FlexRecompileLimit(RuntimeError):
    pass


def _run_compiled(*args, **kwargs):
    """``_compiled``, with Dynamo's recompile limit a hard error instead of its silent
    eager fallback (``fail_on_recompile_limit_hit``)."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            return _compiled(*args, **kwargs)
    except FailOnRecompileLimitHit as e:
        limit = torch._dynamo.config.recompile_limit
        raise FlexRecompileLimit(
            f"FlexAttention needs another compiled kernel, past Dynamo's recompile limit "
            f"({compile_count()} compiled, torch._dynamo.config.recompile_limit = {limit}): "
            "flex_attention would run eagerly, materialising the attention scores. Raise "
            "torch._dynamo.config.recompile_limit, or keep fewer input variants (dtypes, "
            "grad modes, masks) in one process") from e


@dataclass
class MaskCodes:
    """The [B, S] int64 mask codes of a whole (unsplit) micro-batch, on the device: what
    the FlexAttention core attention takes as ``attention_mask`` instead of a dense mask."""

    codes: torch.Tensor


def _run_start(values: torch.Tensor) -> torch.Tensor:
    """[B, S]: the start of the run of equal values each position lies in."""
    pos = torch.arange(values.shape[1], device=values.device).expand_as(values)
    change = torch.ones_like(values, dtype=torch.bool)
    change[:, 1:] = values[:, 1:] != values[:, :-1]
    return torch.where(change, pos, 0).cummax(dim=1).values


def key_intervals(codes: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), [B, S] each: the inclusive key interval of every query row of [B, S]
    ``codes`` (the planner's ``key_intervals`` in torch, on the codes' device)."""
    s = codes.shape[1]
    doc, item = codes >> DOC_SHIFT, codes & ITEM_MASK
    pos = torch.arange(s, device=codes.device).expand_as(codes)
    run_end = s - 1 - _run_start(codes.flip(1)).flip(1)
    text = item == 0
    return (torch.where(text, _run_start(doc), _run_start(codes)),
            torch.where(text, pos, run_end))


def block_mask(codes: torch.Tensor, rows: Optional[torch.Tensor] = None,
               block: int = FLEX_BLOCK) -> BlockMask:
    """The BlockMask of queries at global positions ``rows`` ([S_q], sorted; None: every
    position) against every key of [B, S] ``codes``, built on the codes' device with no
    host read."""
    b, s = codes.shape
    dev = codes.device
    if rows is None:
        rows = torch.arange(s, device=dev)
    sq = rows.shape[0]
    lo, hi = (x[:, rows] for x in key_intervals(codes))  # [B, S_q]
    nq, nk = -(-sq // block), -(-s // block)
    qb = (torch.arange(sq, device=dev) // block).expand(b, sq)
    # Tiles some row of the query block reaches: +1 where an interval starts, -1 after it
    # ends, summed along the key tiles.
    diff = torch.zeros(b, nq, nk + 1, dtype=torch.int32, device=dev)
    ones = torch.ones_like(lo, dtype=torch.int32)
    diff.view(b, -1).scatter_add_(1, qb * (nk + 1) + lo // block, ones)
    diff.view(b, -1).scatter_add_(1, qb * (nk + 1) + hi // block + 1, -ones)
    reached = diff.cumsum(-1)[..., :nk] > 0
    # Full tiles: inside every row's interval (the sequence's last, short tile never is).
    top_lo = torch.full((b, nq), -1, dtype=lo.dtype, device=dev).scatter_reduce(
        1, qb, lo, "amax", include_self=False)
    low_hi = torch.full((b, nq), s, dtype=hi.dtype, device=dev).scatter_reduce(
        1, qb, hi, "amin", include_self=False)
    start = torch.arange(nk, device=dev) * block
    full = ((start >= top_lo[..., None]) & (start + block - 1 <= low_hi[..., None])
            & (start + block <= s))
    partial = reached & ~full

    def listed(tiles):  # [B, nq, nk] bool -> counts [B, 1, nq], indices [B, 1, nq, nk]
        order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True)
        return (tiles.sum(-1, dtype=torch.int32)[:, None],
                order.to(torch.int32)[:, None].contiguous())

    # Per-query tensors padded to the key length (see the module's docstring).
    doc, item = codes >> DOC_SHIFT, codes & ITEM_MASK
    q_pos = torch.zeros(s, dtype=torch.int64, device=dev)
    q_pos[:sq] = rows
    q_doc, q_item = torch.zeros_like(doc), torch.zeros_like(item)
    q_doc[:, :sq], q_item[:, :sq] = doc[:, rows], item[:, rows]

    def mask_mod(bi, h, q, kv):
        pos, iq = q_pos[q], q_item[bi, q]
        return (q_doc[bi, q] == doc[bi, kv]) & torch.where(iq == 0, kv <= pos,
                                                            iq == item[bi, kv])

    return BlockMask.from_kv_blocks(*listed(partial), *listed(full), BLOCK_SIZE=block,
                                    mask_mod=mask_mod, seq_lengths=(sq, s))


class _LastBlockMask:
    """The block mask of the last mask object seen: every layer (and head group) of a
    micro-batch gets the same ``attention_mask`` object, and builds it once."""

    key: object = None
    value: Optional[BlockMask] = None

    @classmethod
    def get(cls, mask, build) -> BlockMask:
        """``mask``: the mask object, or for the causal mask (no mask object) a tuple of
        what its block mask depends on (batch, length, device): equal tuples share one."""
        same = (cls.key == mask) if isinstance(mask, tuple) and isinstance(cls.key, tuple) \
            else cls.key is mask
        if cls.value is None or not same:
            cls.key, cls.value = mask, build()
        return cls.value


class FlexAttention(ContextParallelAttention):
    """Core attention (Megatron-Core's signature) on ``flex_attention``: takes a
    ``ContextParallelMask`` (this rank's queries against the all-gathered keys, gathered
    as ``ContextParallelAttention`` does), ``MaskCodes`` (a whole micro-batch) or None
    (causal). No attention dropout (``attention_choice`` refuses it).

    One kernel over every head (GQA inside it) where no K/V all-gather runs; only a CP
    split runs per group of KV heads (``KV_HEADS_PER_STEP``), each group's gather in flight
    under the previous group's kernel."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        cpm = attention_mask if isinstance(attention_mask, ContextParallelMask) else None
        if cpm is not None and not cpm.replicated:
            return super().forward(query, key, value, attention_mask, attn_mask_type,
                                   attention_bias, packed_seq_params)
        assert attention_bias is None and packed_seq_params is None, (
            "FlexAttention takes its mask as MaskCodes or a ContextParallelMask")
        per_group = self.heads // self.groups
        out = (self._runs(query, key, value, cpm, per_group) if cpm is not None
               else self._dense(query, key, value, attention_mask, per_group))
        return out.reshape(out.shape[0], out.shape[1], -1)

    def _flex(self, q, k, v, mask: BlockMask):
        """q [sq, b, hq, d], k/v [s, b, hk, d] -> [sq, b, hq, d]."""
        if k.shape[0] == 1:  # one token attends itself (a length-1 recompile breaks
            return v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)  # the CPU kernel)
        q, k, v = (x.permute(1, 2, 0, 3) for x in (q, k, v))
        out = _run_compiled(q, k, v, block_mask=mask, scale=self.softmax_scale,
                            enable_gqa=q.shape[1] != k.shape[1])
        return out.permute(2, 0, 1, 3)

    def _runs(self, q, k, v, cpm: ContextParallelMask, per_group):
        return self._flex(q, k, v, _LastBlockMask.get(
            cpm, lambda: block_mask(cpm.codes, cpm.local)))

    def _dense(self, q, k, v, attention_mask, per_group):
        key = attention_mask
        if attention_mask is None:  # causal: one text document, the same for every layer
            b, s, dev = q.shape[1], q.shape[0], q.device
            key = ("causal", b, s, dev)
            build = lambda: block_mask(torch.zeros(b, s, dtype=torch.int64,  # noqa: E731
                                                   device=dev))
        elif isinstance(attention_mask, MaskCodes):
            build = lambda: block_mask(attention_mask.codes)  # noqa: E731
        else:
            raise TypeError("FlexAttention takes MaskCodes or a ContextParallelMask, not a "
                            f"{type(attention_mask).__name__} mask")
        return self._flex(q, k, v, _LastBlockMask.get(key, build))

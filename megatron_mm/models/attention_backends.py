"""Which attention kernel each module's layers run, for the start-up log.

Local layers say what they compute (Megatron-Core's ``DotProductAttention``: baddbmm, a
softmax, bmm; ours for context parallelism: einsum and a torch softmax). Transformer
Engine picks its backend per call from the inputs (``DotProductAttention.forward`` ->
``dot_product_attention.utils.get_attention_backend(AttentionParams)``, TE >= 2.4): the
log asks TE the same question for each module's configured shapes (dtype, heads, head
dim, mask type, layout, sequence length, dropout, determinism; ``NVTE_FLASH_ATTN`` /
``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN`` are read by TE there), so fp32 runs, where TE
disables its fused and flash kernels, show up as unfused.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Dict, Iterable, List, Optional

import torch

_TE_UTILS = "transformer_engine.pytorch.attention.dot_product_attention.utils"


def is_te_attention(module: torch.nn.Module) -> bool:
    """A subclass of Transformer Engine's ``DotProductAttention`` (Megatron-Core's
    ``TEDotProductAttention`` and ours over it)."""
    return any(c.__name__ == "DotProductAttention"
               and c.__module__.startswith("transformer_engine.")
               for c in type(module).__mro__)


def te_attention_params(module, dtype: torch.dtype, batch_size: int, seq_length: int,
                        fields: Iterable[str]) -> dict:
    """The ``AttentionParams`` fields TE's forward would fill for ``module`` (TE's
    ``DotProductAttention``) on [seq_length, batch_size] inputs, restricted to ``fields``
    (those this TE version has)."""
    thd = getattr(module, "packed_thd", False)  # one packed sequence, TE's THD varlen
    fmt = "thd" if thd else module.qkv_format
    mask = "padding" if thd else module.attn_mask_type
    cp_group = getattr(module, "cp_group", None)
    cp_size = cp_group.size() if hasattr(cp_group, "size") else 1
    tp = getattr(module, "tp_size", 1) or 1
    params = dict(
        qkv_dtype=dtype, qkv_layout="_".join([fmt] * 3), batch_size=1 if thd else batch_size,
        num_heads=module.num_attention_heads // tp,
        num_gqa_groups=module.num_gqa_groups_per_partition,
        max_seqlen_q=seq_length, max_seqlen_kv=seq_length,
        head_dim_qk=module.hidden_size_per_attention_head_k,
        head_dim_v=module.hidden_size_per_attention_head_v,
        attn_mask_type=mask, window_size=getattr(module, "window_size", None),
        attention_dropout=module.attention_dropout, context_parallel=cp_size > 1,
        cp_comm_type=getattr(module, "cp_comm_type", "p2p"), cp_size=cp_size,
        deterministic=module.deterministic, is_training=True, fp8=False,
        softmax_type=getattr(module, "softmax_type", "vanilla"))
    fields = set(fields)
    return {k: v for k, v in params.items() if k in fields}


def te_backend(module, dtype: torch.dtype, batch_size: int, seq_length: int) -> str:
    """TE's choice for ``module`` (its ``get_attention_backend``)."""
    try:
        utils = importlib.import_module(_TE_UTILS)
    except ImportError as e:  # TE < 2.4 keeps it elsewhere
        return f"transformer_engine (backend not known: {e})"
    fields = [f.name for f in dataclasses.fields(utils.AttentionParams)]
    try:  # a TE version whose attributes or answer differ: said, not fatal to the run
        params = utils.AttentionParams(**te_attention_params(module, dtype, batch_size,
                                                             seq_length, fields))
        flash, flash_version, fused, fused_backend, unfused, _ = (
            utils.get_attention_backend(params))
    except (AttributeError, TypeError, ValueError) as e:
        return f"transformer_engine (backend not known: {type(e).__name__}: {e})"
    what = f"{params.attn_mask_type} mask, {params.qkv_layout}"
    if flash:
        return f"transformer_engine FlashAttention {flash_version} ({what})"
    if fused:
        return f"transformer_engine FusedAttention sub-backend {int(fused_backend)} ({what})"
    if unfused:
        return f"transformer_engine UnfusedDotProductAttention ({what})"
    return f"transformer_engine: no backend for these inputs ({what})"


def local_backend(module) -> str:
    """What a local core attention computes."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from .cp_attention import ContextParallelAttention
    from .flex_attention import FlexAttention

    if isinstance(module, FlexAttention):
        return ("FlexAttention (torch.compile'd flex_attention, block masks from the mask "
                "codes; CP: all-gathered K/V)")
    if isinstance(module, ContextParallelAttention):
        return ("local (ours, context parallel: all-gathered K/V, einsum, torch softmax in "
                "fp32; unfused)")
    if isinstance(module, DotProductAttention):
        fused = module.scale_mask_softmax.scaled_masked_softmax_fusion
        softmax = ("Apex's fused scale-mask-softmax where its shape rules allow, else torch "
                   "softmax" if fused else "torch softmax")
        return f"local (Megatron-Core DotProductAttention, unfused: baddbmm, {softmax}, bmm)"
    return f"local ({type(module).__name__})"


def _label(name: str) -> str:
    """The model part a module belongs to: "llm" or the encoder's (and its projector's)
    name."""
    parts = name.split(".")
    while parts and parts[0] == "module":  # DDP / Float16Module wrappers
        parts = parts[1:]
    top = parts[0] if parts else name
    if top == "language_model":
        return "llm"
    return top.rsplit("_", 1)[0]


def describe_attention_backends(chunks, micro_batch_size: int, llm_seq_length: int,
                                dtype: torch.dtype) -> Dict[str, List[str]]:
    """{model part: its core attentions' backends} over this rank's ``chunks``."""
    found: Dict[str, List[str]] = {}
    for chunk in chunks:
        for name, module in chunk.named_modules():
            if not name.endswith("core_attention"):
                continue
            label = _label(name)
            part = None if label == "llm" else getattr(chunk, f"{label}_model", None)
            seq = getattr(part, "layer_seq_length", None) or llm_seq_length
            desc = (te_backend(module, dtype, micro_batch_size, seq)
                    if is_te_attention(module) else local_backend(module))
            if desc not in found.setdefault(label, []):
                found[label].append(desc)
    return found


def attention_backend_lines(chunks, micro_batch_size: int, llm_seq_length: int,
                            dtype: torch.dtype, group=None) -> Optional[List[str]]:
    """One line per model part, from every rank's chunks (pipeline stages hold different
    parts): a host all-gather at start-up. Rank 0 of ``group`` gets the lines, the others
    None."""
    mine = describe_attention_backends(chunks, micro_batch_size, llm_seq_length, dtype)
    everyone = [mine]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size(group) > 1:
        everyone = [None] * torch.distributed.get_world_size(group)
        torch.distributed.all_gather_object(everyone, mine, group=group)
    if torch.distributed.is_initialized() and torch.distributed.get_rank(group) != 0:
        return None
    merged: Dict[str, List[str]] = {}
    for found in everyone:
        for label, descs in found.items():
            known = merged.setdefault(label, [])
            known.extend(d for d in descs if d not in known)
    return [f"{label}: {'; '.join(descs)}" for label, descs in sorted(merged.items())]

"""The one place that picks the LLM layers' core attention, by mask family, device and
library, or as ``--attention-backend`` forces it.

Megatron-LM's ``--attention-backend {flash,fused,unfused,local,auto}`` keeps its meaning:
``flash`` / ``fused`` / ``unfused`` pin Transformer Engine's kernel (Megatron-Core's
``LanguageModule`` sets ``NVTE_*_ATTN`` from the config's ``attention_backend``) and need
TE layers; ``local`` is Megatron-Core's own attention and needs local layers (Megatron-LM:
``--spec local``); ``auto`` decides. One value is ours: ``flex``, FlexAttention for every
mask (``models/flex_attention.py``).

``auto``: TE's fused / flash kernels where the mask is plain causal (and Megatron-Core's TE
CP attention where it computes the same thing, ``choose_cp_attention``; packed causal
samples on TE are THD); FlexAttention for the other masks, for our CP split and for LoRA's
local layers (every mask) on CUDA;
the local path (Megatron-Core's ``DotProductAttention`` with the dense mask, our einsum CP
attention) elsewhere. FlexAttention needs no dropout, and on CPU it runs forward only
(torch has no backward there): CPU training keeps the local path, and asking for flex
there is an error naming the flag. Pure: capabilities come in as arguments.
"""

from __future__ import annotations

from typing import List, Optional

from ..config import ConfigError
from .specs import CPAttentionChoice, choose_cp_attention
from .te_attention_rules import KERNEL_NAMES, TE_KERNELS, te_kernels

ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto", "flex")
FLEX = "FlexAttention (torch.nn.attention.flex_attention; block masks from the mask codes)"


def _flex_blockers(cuda: bool, training: bool, attention_dropout: float) -> List[str]:
    blockers = []
    if not cuda and training:
        blockers.append("no CUDA device, and torch runs no FlexAttention backward on CPU "
                        "(it does forward-only passes there: --train-iters 0)")
    if attention_dropout > 0:
        blockers.append(f"--attention-dropout {attention_dropout:g} (FlexAttention has no "
                        "dropout)")
    return blockers


def choose_attention(backend: str, cp_size: int, transformer_impl: str, te_importable: bool,
                     cuda: bool, media_attention: str = "causal", packed: bool = False,
                     assignment: str = "ours", cp_comm_type: Optional[str] = None,
                     training: bool = True, attention_dropout: float = 0.0,
                     half_precision: bool = True, lora: bool = False) -> CPAttentionChoice:
    """The LLM's core attention (``CPAttentionChoice``: kind ``flex``, or
    ``choose_cp_attention``'s ``transformer_engine`` / ``ours`` under CP and ``none``, the
    layers' own, without) and why, for the start-up log. ``half_precision``: --bf16 (or
    --fp16); a pinned TE kernel must be one TE enables for the LLM's mask and for the
    encoders' (``te_attention_rules``), else an error naming the flag. ``lora``: LoRA
    adapters (--lora-rank), which need the local layers: on CUDA, ``auto`` gives them
    FlexAttention for the plain causal mask too, where Megatron-Core's local attention
    would materialise the [B, heads, S, S] scores."""
    if backend not in ATTENTION_BACKENDS:
        raise ConfigError(f"--attention-backend must be one of {ATTENTION_BACKENDS}, "
                          f"got {backend!r}")
    if backend in TE_KERNELS and transformer_impl != "transformer_engine":
        raise ConfigError(f"--attention-backend {backend} pins Transformer Engine's kernel: "
                          "it needs --transformer-impl transformer_engine")
    if backend == "local" and transformer_impl != "local":
        raise ConfigError("--attention-backend local is Megatron-Core's own attention: it "
                          "needs --transformer-impl local")
    blockers = _flex_blockers(cuda, training, attention_dropout)
    if backend == "flex":
        if blockers:
            raise ConfigError("--attention-backend flex cannot train here: "
                              + "; ".join(blockers) + ". Pass --attention-backend auto")
        if cp_comm_type is not None:
            raise ConfigError(f"--cp-comm-type {cp_comm_type} is for Megatron-Core's "
                              "Transformer Engine CP attention, not FlexAttention: drop it")
        return CPAttentionChoice("flex", f"{FLEX}, as --attention-backend flex asks")
    base = choose_cp_attention(cp_size, transformer_impl, te_importable, cuda,
                               media_attention, packed, assignment, cp_comm_type)
    if backend in TE_KERNELS:
        _check_pinned_kernel(backend, _llm_te_mask_type(base.kind, cp_size, media_attention,
                                                        packed), half_precision)
    mask = ("packed samples" if packed else "") + (
        (" with " if packed else "") + "bidirectional media items"
        if media_attention != "causal" else "")
    if base.kind == "transformer_engine":
        return base
    if cp_size == 1:
        own = f"the {transformer_impl} layers' own attention"
        if not mask and lora and transformer_impl == "local" and backend == "auto" \
                and cuda and not blockers:
            return CPAttentionChoice("flex", f"{FLEX} for LoRA's local layers on CUDA "
                                     "(Megatron-Core's local attention materialises the "
                                     "scores)")
        if not mask:
            return CPAttentionChoice("none", f"{own} (plain causal mask)")
        if packed and media_attention == "causal" and transformer_impl == "transformer_engine":
            return CPAttentionChoice("none", f"{own} (packed causal samples: THD)")
    if backend == "auto" and cuda and not blockers:
        what = f"our CP split{' of ' + mask if mask else ''}" if cp_size > 1 else mask
        return CPAttentionChoice("flex", f"{FLEX} for {what} on CUDA")
    why = f"--attention-backend {backend}" if backend != "auto" else "; ".join(
        blockers or ["no CUDA device"])
    if cp_size > 1:
        return CPAttentionChoice("ours", f"{base.reason}; not FlexAttention: {why}")
    kernel = ("Transformer Engine's arbitrary-mask kernel" if transformer_impl ==
              "transformer_engine" else "Megatron-Core's DotProductAttention")
    return CPAttentionChoice("none", f"{kernel} with the dense mask of {mask}; not "
                             f"FlexAttention: {why}")


def _llm_te_mask_type(kind: str, cp_size: int, media_attention: str,
                      packed: bool) -> Optional[str]:
    """The mask type the LLM's TE attention declares (``te_attention_mask``,
    ``packed_sequences``), None where the LLM runs no TE attention (our CP attention)."""
    if kind == "transformer_engine":
        return "causal"  # TE's CP: plain causal masks only
    if cp_size > 1:
        return None
    if media_attention != "causal":
        return "arbitrary"  # the dense [B, 1, S, S] mask
    return "padding_causal" if packed else "causal"  # packed samples: THD


def _check_pinned_kernel(backend: str, llm_mask: Optional[str], half_precision: bool) -> None:
    """A pinned TE kernel (Megatron-Core sets ``NVTE_*_ATTN`` process-wide) that TE
    disables for one of the process's TE attentions leaves it no backend: TE's first
    forward would fail. Stop up front instead."""
    name = KERNEL_NAMES[backend]
    if not half_precision and backend not in te_kernels("causal", False):
        raise ConfigError(f"--attention-backend {backend} pins Transformer Engine's {name}, "
                          "which TE runs on bf16 / fp16 inputs only: pass --bf16, or "
                          "--attention-backend unfused or auto")
    if llm_mask is not None and backend not in te_kernels(llm_mask, half_precision):
        raise ConfigError(f"--attention-backend {backend} pins Transformer Engine's {name}, "
                          f"which TE disables for the LLM's '{llm_mask}' mask (the dense mask "
                          "of --media-attention bidirectional; TE runs only "
                          "UnfusedDotProductAttention there): pass --attention-backend "
                          "unfused, flex or auto")
    # The pin reaches the encoders' TE attention too (ENCODER_MASK_TYPES): TE takes their
    # masks on every kernel, so only the dtype rule above can leave them without one.

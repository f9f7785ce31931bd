"""Transformer Engine's attention-backend rules that a pinned ``--attention-backend`` can
break, as TE's source states them (``transformer_engine/pytorch/attention/
dot_product_attention/utils.py``, ``get_attention_backend``, TE 2.9 to 2.18 alike):

- the mask-type table in its comments ("attn_mask_type | attention_mask | supported
  backends"): ``no_mask``, ``padding``, ``causal``, ``padding_causal``,
  ``causal_bottom_right``, ``padding_causal_bottom_right``: All (self-attention);
  ``arbitrary``: UnfusedDotProductAttention, and the code after it:
  ``if attn_mask_type == "arbitrary": ... use_flash_attention = False ...
  use_fused_attention = False``;
- the dtype filter: ``if qkv_dtype not in [torch.bfloat16, torch.float16]`` disables
  FlashAttention, and FusedAttention takes bf16, fp16 (and FP8) only;
- ``NVTE_FLASH_ATTN`` / ``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN`` are read there with
  ``os.getenv`` at every call: process-wide. Megatron-Core's ``LanguageModule.
  _set_attention_backend`` writes them from the LLM's ``config.attention_backend``, and
  Megatron-Core 0.19 reads ``attention_backend`` nowhere else (no per-module setting), so a
  pinned LLM backend pins every TE attention of the process, the encoders' included.

Pure Python: ``attention_choice`` checks a pinned kernel against these rules up front.
"""

from __future__ import annotations

from typing import Tuple

TE_KERNELS = ("flash", "fused", "unfused")
# mask type -> the TE kernels that take it (self-attention)
TE_MASK_KERNELS = {
    "no_mask": TE_KERNELS, "padding": TE_KERNELS, "causal": TE_KERNELS,
    "padding_causal": TE_KERNELS, "causal_bottom_right": TE_KERNELS,
    "padding_causal_bottom_right": TE_KERNELS, "arbitrary": ("unfused",),
}
HALF_PRECISION_ONLY = ("flash", "fused")  # bf16 / fp16 inputs only
KERNEL_NAMES = {"flash": "FlashAttention", "fused": "FusedAttention",
                "unfused": "UnfusedDotProductAttention"}


def te_kernels(mask_type: str, half_precision: bool) -> Tuple[str, ...]:
    """The TE kernels ``get_attention_backend`` leaves enabled for a self-attention with
    ``mask_type`` in bf16 / fp16 (``half_precision``) or fp32."""
    kernels = TE_MASK_KERNELS[mask_type]
    if not half_precision:
        kernels = tuple(k for k in kernels if k not in HALF_PRECISION_ONLY)
    return kernels


# The mask types the encoders' TE attention declares (families' layer specs): no_mask
# (ViT, InternViT, the audio encoder), padding (a ViT padded under sequence parallelism,
# Qwen2.5-VL / Qwen3-VL towers' THD segments).
ENCODER_MASK_TYPES = ("no_mask", "padding")

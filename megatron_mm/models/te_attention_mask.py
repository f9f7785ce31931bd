"""The mask type the LLM's self-attention declares, so that no impl silently trains causal.

Megatron-Core's local ``DotProductAttention`` applies whatever ``attention_mask`` it gets
(the causal mask only when it gets none). Transformer Engine's ``TEDotProductAttention``
obeys the declared ``attn_mask_type``: with ``causal`` it ignores the mask, so a
``--media-attention bidirectional`` mask would be dropped. A dense mask on TE therefore
declares ``arbitrary``: TE then applies the ``[B, 1, S, S]`` bool mask (True = masked out,
Megatron's convention too). With context parallelism the mask is ours to apply
(``ContextParallelAttention``, or TE's CP, which takes causal masks only).

An encoder whose sequence is padded (a ViT's patches and class token under
``--sequence-parallel``) declares ``padding`` and passes the ``[N, 1, 1, T]`` key padding
mask (``EncoderParts.padding_mask``): TE turns it into cu_seqlens for its flash / fused
kernels, the local attention broadcasts it. Megatron-Core's ViT specs declare ``no_mask``,
under which TE would attend to the padding.
"""

from __future__ import annotations

import copy
import dataclasses

from megatron.core.transformer.enums import AttnMaskType


def language_attn_mask_type(transformer_impl: str, media_attention: str,
                            context_parallel: bool = False) -> AttnMaskType:
    if (transformer_impl == "transformer_engine" and media_attention != "causal"
            and not context_parallel):
        return AttnMaskType.arbitrary
    return AttnMaskType.causal


def with_attn_mask_type(layer_spec, mask_type: AttnMaskType):
    """A copy of a layer spec whose self-attention declares ``mask_type``."""
    attention = copy.copy(layer_spec.submodules.self_attention)
    attention.params = {**attention.params, "attn_mask_type": mask_type}
    submodules = dataclasses.replace(layer_spec.submodules, self_attention=attention)
    return dataclasses.replace(layer_spec, submodules=submodules)


def padded_layer_spec(layer_spec, padding: int):
    """An encoder's layer spec for a sequence with ``padding`` trailing pad tokens."""
    return with_attn_mask_type(layer_spec, AttnMaskType.padding) if padding else layer_spec

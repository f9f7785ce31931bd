"""A hybrid LLM's Gated DeltaNet layers (Qwen3.5): Megatron-Core's ``GatedDeltaNet`` in the
layers ``LanguageModelConfig.linear_attention_pattern()`` marks 1, full (gated) attention in
the others.

- Specs: TE's is Megatron-Core's own (``get_gated_delta_net_module_spec``: the input norm
  fused into ``in_proj``); the local one puts the same modules in the local GPT layer
  (``in_proj`` a ``ColumnParallelLinear`` after the layer's ``input_layernorm``). Either way
  the layer's MLP (dense or MoE) and pre-MLP norm are the full-attention layer's.
- The gated output norm is a plain RMSNorm (weight, not 1 + weight) even where the LLM's
  norms are zero-centred (Qwen3.5: ``layernorm_zero_centered_gamma``), as Qwen3.5's
  ``RMSNormGated`` is; its weight converts bit for bit.
- Packed samples (``--data-balance``): the layers get the row's ``PackedSequences`` as
  ``packed_seq_params`` on both impls (``training/attention.py``); ``SampleIsolatedGDN``
  hands its THD params (``cu_seqlens``) to Megatron-Core's GDN, whose kernels (FLA's, or
  the CPU stand-ins of ``patches/gated_delta_net.py``) restart the recurrent and
  convolution state at every sample. The local full-attention layers keep the dense
  block-diagonal mask and drop the carrier (``DropsPackedSamples``). Upstream's cu_seqlens
  check reads the device (``.cpu().item()``); the carrier was checked on the host, so the
  subclass skips it.
- Context parallelism (``--context-parallel-size`` > 1): head-parallel over the CP group
  under the package's token assignment, ``models/linear_attention_cp.py``.
- FLA is required where CUDA runs (``require_fla``): never a silent fallback to a torch
  rule.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Optional

from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec

from ..config import ConfigError
from ..runtime_patches.tp_partial_grads import mark as mark_tp_partial
from .norms import SequenceParallelNorm
from .packed_sequences import PackedSequences

FLA_INSTALL = "pip install flash-linear-attention"


def require_fla(cuda: bool) -> None:
    """An error naming the package where CUDA runs without flash-linear-attention (its
    kernels are what Megatron-Core's GDN runs there); without CUDA the CPU stand-ins run."""
    from megatron.core.ssm.gated_delta_net import common

    if cuda and not common.HAVE_FLA:
        raise ConfigError("the Gated DeltaNet layers (--experimental-attention-variant "
                          "gated_delta_net) need flash-linear-attention on CUDA: "
                          f"{FLA_INSTALL}")


class SampleIsolatedGDN(GatedDeltaNet):
    """Megatron-Core's GDN taking the packed row's carrier: its THD params go to the
    kernels, so no state crosses a sample boundary."""

    def forward(self, hidden_states, attention_mask, inference_context=None,
                packed_seq_params=None, sequence_len_offset=None, **kwargs):
        if self.cp_size > 1 and inference_context is None:  # the package's token split
            from .linear_attention_cp import head_parallel_forward

            return head_parallel_forward(self, hidden_states, attention_mask,
                                         packed_seq_params)
        if isinstance(packed_seq_params, PackedSequences):
            packed_seq_params = packed_seq_params.thd
        return super().forward(hidden_states, attention_mask, inference_context,
                               packed_seq_params, sequence_len_offset, **kwargs)

    def _resolve_cu_seqlens(self, cu_seqlens_padded, cu_seqlens_actual, total_seq_len, name,
                            cp_size: int = 1):
        # checked on the host when the carrier was made (packed_sequences): no device read
        return cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens_actual


class DropsPackedSamples:
    """Mixed in before a local core attention: the dense mask isolates the packed samples,
    so the carrier meant for the GDN layers is not passed on."""

    def forward(self, query, key, value, attention_mask, *args, packed_seq_params=None,
                **kwargs):
        if isinstance(packed_seq_params, PackedSequences):
            packed_seq_params = None
        return super().forward(query, key, value, attention_mask, *args,
                               packed_seq_params=packed_seq_params, **kwargs)


@functools.lru_cache(maxsize=None)
def drops_packed_samples(base: type) -> type:
    return type(f"Packed{base.__name__}", (DropsPackedSamples, base), {"__module__": __name__})


class PlainNorm:
    """A norm slot built as ``norm`` with ``layernorm_zero_centered_gamma`` off (GDN's
    gated output norm multiplies by its weight, as Qwen3.5's ``RMSNormGated``)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        if getattr(config, "layernorm_zero_centered_gamma", False):
            config = copy.copy(config)
            config.layernorm_zero_centered_gamma = False
        # one weight for every value head, TP splits the heads: summed over TP with or
        # without sequence parallelism (patches/tp_partial_grads.py)
        return mark_tp_partial(cls.norm(config=config, hidden_size=hidden_size, eps=eps,
                                        **kwargs))


@functools.lru_cache(maxsize=None)
def plain_norm(norm: type) -> type:
    return type(f"Plain{norm.__name__}", (PlainNorm,), {"norm": norm, "__module__": __name__})


def gdn_attention_spec(transformer_impl: str) -> ModuleSpec:
    """The GDN module's spec: TE's from Megatron-Core, or the same modules locally."""
    from .fla_host_lengths import HostLengthsGDN  # SampleIsolatedGDN, FLA's host lengths
    if transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import (TELayerNormColumnParallelLinear,
                                                                 TENorm, TERowParallelLinear)

        # Megatron-Core's get_gated_delta_net_module_spec with TESpecProvider, written out
        # so that it needs no TransformerConfig (its backend choice reads only the impl).
        submodules = GatedDeltaNetSubmodules(in_proj=TELayerNormColumnParallelLinear,
                                             out_norm=plain_norm(TENorm),
                                             out_proj=TERowParallelLinear)
        return ModuleSpec(module=HostLengthsGDN, submodules=submodules,
                          metainfo={"fuse_input_layernorm": True})
    submodules = GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear,
                                         out_norm=plain_norm(SequenceParallelNorm),
                                         out_proj=RowParallelLinear)
    return ModuleSpec(module=HostLengthsGDN, submodules=submodules,
                      metainfo={"fuse_input_layernorm": False})


# The local layer's input norm is the TE GDN layer's in_proj norm (checkpoint keys).
GDN_LOCAL_TO_TE = {"input_layernorm.": "self_attention.in_proj.layer_norm_"}


def gdn_layer_spec(full_layer: ModuleSpec, transformer_impl: str) -> ModuleSpec:
    """A GDN layer: ``full_layer`` (the LLM's full-attention layer spec, dense or MoE) with
    its attention replaced by GDN; TE's fuses the input norm into ``in_proj``."""
    attention = gdn_attention_spec(transformer_impl)
    sub = full_layer.submodules
    keys = dict(sub.sharded_state_dict_keys_map or {})
    if transformer_impl == "transformer_engine":
        replaced = dataclasses.replace(sub, input_layernorm=IdentityOp,
                                       self_attention=attention)
    else:
        keys.update(GDN_LOCAL_TO_TE)
        replaced = dataclasses.replace(sub, self_attention=attention,
                                       sharded_state_dict_keys_map=keys)
    return dataclasses.replace(full_layer, submodules=replaced)


def full_layer_for_packed_gdn(full_layer: ModuleSpec) -> ModuleSpec:
    """A local full-attention layer that takes the GDN layers' packed carrier and ignores
    it (its dense mask isolates the samples)."""
    attention = full_layer.submodules.self_attention
    core = attention.submodules.core_attention
    if getattr(core, "packed_thd", False):  # TE's THD attention takes the carrier itself
        return full_layer
    attention = copy.copy(attention)
    attention.submodules = dataclasses.replace(attention.submodules,
                                               core_attention=drops_packed_samples(core))
    return dataclasses.replace(full_layer, submodules=dataclasses.replace(
        full_layer.submodules, self_attention=attention))


def hybrid_layers(pattern, dense_full: ModuleSpec, moe_full: Optional[ModuleSpec],
                  moe_pattern, transformer_impl: str) -> list:
    """One spec per LLM layer: GDN where ``pattern`` is 1, the full-attention layer where
    0; the MLP dense or MoE by ``moe_pattern`` (None: every layer dense)."""
    full = {False: full_layer_for_packed_gdn(dense_full)}
    if moe_full is not None:
        full[True] = full_layer_for_packed_gdn(moe_full)
    gdn = {sparse: gdn_layer_spec(spec, transformer_impl) for sparse, spec in full.items()}
    out = []
    for i, linear in enumerate(pattern):
        sparse = bool(moe_pattern[i]) if moe_pattern is not None else False
        out.append(gdn[sparse] if linear else full[sparse])
    return out


def describe_linear_attention(lm) -> str:
    """The startup log's line: which layers are GDN and which kernels run them."""
    from megatron.core.ssm.gated_delta_net import common

    pattern = lm.linear_attention_pattern()
    stand_in = common.chunk_gated_delta_rule.__module__.startswith("megatron_mm")
    kernels = ("CPU stand-ins for flash-linear-attention (patches/gated_delta_net.py)"
               if stand_in else "flash-linear-attention's kernels")
    return (f"LLM layers: {sum(pattern)} Gated DeltaNet, {len(pattern) - sum(pattern)} full "
            f"attention (pattern {''.join(map(str, pattern))}: 1 linear); GDN on {kernels}")


def gdn_transformer_fields(lm) -> dict:
    """Megatron-Core's ``TransformerConfig`` fields of the GDN layers (Megatron-LM's flag
    names), none without linear attention."""
    la = lm.linear_attention
    if la is None:
        return {}
    if la.chunk_size != 64:
        raise ConfigError(f"linear attention chunk size {la.chunk_size}: Megatron-Core's "
                          "GDN kernels (FLA's chunked rule) run chunks of 64")
    return dict(experimental_attention_variant="gated_delta_net",
                linear_attention_freq=list(lm.linear_attention_pattern()),
                linear_conv_kernel_dim=la.linear_conv_kernel_dim,
                linear_key_head_dim=la.linear_key_head_dim,
                linear_value_head_dim=la.linear_value_head_dim,
                linear_num_key_heads=la.linear_num_key_heads,
                linear_num_value_heads=la.linear_num_value_heads)

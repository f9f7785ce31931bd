"""Layer specs for every module, chosen in one place: Transformer Engine or local.

``transformer_engine`` needs TE importable and a CUDA device; ``local`` uses only
Megatron-Core's own layers and runs anywhere. Everything else in the package asks this
module for its specs and never imports TE itself.

Context parallelism: ``choose_cp_attention`` (the one place that decides) picks the LLM
layers' CP core attention. Megatron-Core's own (``TEDotProductAttention`` with
``--cp-comm-type``) needs TE on CUDA and knows only causal masks over Megatron's zigzag
split; ours (``ContextParallelAttention``) takes any multimodal mask and any token
assignment, with either impl. With ours the LLM's ``TransformerConfig`` keeps
``context_parallel_size=1`` so that no Megatron-Core module applies its own CP (RoPE
slicing, the TE-only assert); with TE's it carries the CP size and ``cp_comm_type``. Either
way the tokens are split by our zigzag ``ContextParallelMask`` and RoPE runs at global
positions (``MultimodalModel``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.models.vision import vit_layer_specs
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm

from .. import te_import
from ..config import ConfigError
from ..te_import import transformer_engine_installed
from .context_parallel import ContextParallelMask
from .cp_attention import ContextParallelAttention
from .flex_attention import FlexAttention
from .moe_router import SequenceScaledRouter
from .norms import SequenceParallelNorm
from .packed_sequences import thd_attention
from .te_attention_mask import language_attn_mask_type, with_attn_mask_type
from .te_names import with_te_checkpoint_names

TRANSFORMER_IMPLS = ("local", "transformer_engine")
CP_ATTENTIONS = ("none", "ours", "transformer_engine", "flex")  # flex: attention_choice.py
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")  # Megatron's --cp-comm-type


def transformer_engine_importable() -> bool:
    return te_import.import_error() is None


def transformer_engine_available() -> bool:
    """TE importable and a CUDA device to run it on."""
    return torch.cuda.is_available() and transformer_engine_importable()


def default_transformer_impl() -> str:
    """Megatron-LM's default, ``transformer_engine``, where CUDA runs and TE is installed
    (an install that does not import then stops the run: ``require_transformer_engine``);
    ``local`` elsewhere."""
    if torch.cuda.is_available() and transformer_engine_installed():
        return "transformer_engine"
    return "local"


def require_transformer_engine(defaulted: bool = False) -> None:
    """An error naming the flag unless TE imports and CUDA runs: never a silent fallback to
    local layers. ``defaulted``: the impl came from ``default_transformer_impl``."""
    if transformer_engine_available():
        return
    flag = "--transformer-impl transformer_engine" + (
        " (the default where CUDA runs and Transformer Engine is installed)" if defaulted
        else "")
    if not torch.cuda.is_available():
        raise ConfigError(f"{flag} needs a CUDA device: pass --transformer-impl local")
    raise ConfigError(
        f"{flag}: Transformer Engine does not import on this CUDA machine: "
        f"{te_import.import_error()}. Install it into this torch "
        f"({te_import.INSTALL}) or pass --transformer-impl local")


@dataclass(frozen=True)
class CPAttentionChoice:
    """Which CP core attention the LLM layers use, why (for the startup log), and TE's
    ``cp_comm_type`` when it is TE's."""

    kind: str  # one of CP_ATTENTIONS
    reason: str
    cp_comm_type: Optional[str] = None


def choose_cp_attention(cp_size: int, transformer_impl: str, te_importable: bool, cuda: bool,
                        media_attention: str = "causal", packed: bool = False,
                        assignment: str = "ours",
                        cp_comm_type: Optional[str] = None) -> CPAttentionChoice:
    """Megatron-Core's TE CP attention where it computes the same thing (TE on CUDA,
    ``--transformer-impl transformer_engine``, a plain causal mask, Megatron's zigzag
    split), else ours. ``--cp-comm-type`` is TE's alone: asking for it where TE's CP cannot
    run is an error, not a silent fallback. Pure: capabilities come in as arguments."""
    if cp_comm_type is not None and cp_comm_type not in CP_COMM_TYPES:
        raise ConfigError(f"--cp-comm-type must be one of {CP_COMM_TYPES}, got {cp_comm_type!r}")
    if cp_size == 1:
        return CPAttentionChoice("none", "no context parallelism (--context-parallel-size 1)")
    blockers = []
    if transformer_impl != "transformer_engine":
        blockers.append(f"--transformer-impl {transformer_impl}")
    if not te_importable:
        blockers.append("Transformer Engine is not importable")
    if not cuda:
        blockers.append("no CUDA device")
    if media_attention != "causal":
        blockers.append(f"--media-attention {media_attention} (TE's CP knows only causal)")
    if packed:
        blockers.append("packed sequences (--data-balance: a block-diagonal mask)")
    if assignment != "zigzag":
        blockers.append(f"--context-parallel-assignment {assignment} (TE's CP needs zigzag)")
    if blockers:
        if cp_comm_type is not None:
            raise ConfigError(
                f"--cp-comm-type {cp_comm_type} is for Megatron-Core's Transformer Engine CP "
                f"attention, which cannot run here: {'; '.join(blockers)}. Our CP attention "
                "(any mask, any assignment) all-gathers K/V and takes no --cp-comm-type: "
                "drop the flag")
        return CPAttentionChoice(
            "ours", "our CP attention (any mask, any token assignment), not TE's: "
            + "; ".join(blockers))
    comm = cp_comm_type or "p2p"  # Megatron's default
    if comm == "a2a+p2p":  # TEDotProductAttention then asks for hierarchical CP groups
        raise ConfigError("--cp-comm-type a2a+p2p needs hierarchical CP groups (Megatron's "
                          "--hierarchical-context-parallel-sizes), not wired here: use p2p, "
                          "a2a or allgather")
    return CPAttentionChoice(
        "transformer_engine", f"Megatron-Core's TE CP attention (TEDotProductAttention, "
        f"--cp-comm-type {comm}): causal mask, zigzag split, TE on CUDA", comm)


@dataclass(frozen=True)
class LayerSpecs:
    """The specs of one model: ViT layers, LLM layers, projector linears and norms."""

    impl: str
    vision_layer: ModuleSpec
    language_layer: ModuleSpec
    projector: MLPSubmodules
    vision_norm: type
    # The LLM's MoE layer (Megatron-Core's MoELayer MLP), for an MoE LLM; None: dense.
    language_moe_layer: Optional[ModuleSpec] = None


def get_layer_specs(transformer_impl: str, qk_layernorm: bool = False,
                    context_parallel: bool = False, cp_attention: str = "ours",
                    media_attention: str = "causal", packed: bool = False,
                    num_experts: Optional[int] = None, moe_grouped_gemm: bool = False
                    ) -> LayerSpecs:
    """``cp_attention`` (``CPAttentionChoice.kind``) picks the core attention when
    ``context_parallel``, and FlexAttention (``flex``) with or without;
    ``media_attention`` the LLM's mask type (``te_attention_mask``);
    ``packed`` (``--data-balance``) with TE and a causal mask: TE's THD attention over the
    packed samples (``packed_sequences.py``); ``num_experts``: the LLM's MoE layers too
    (``moe_grouped_gemm``: TE's grouped GEMM). Dense and MoE layers get the same attention."""
    specs = _impl_specs(transformer_impl, qk_layernorm, num_experts, moe_grouped_gemm)
    if context_parallel and cp_attention == "transformer_engine" \
            and transformer_impl != "transformer_engine":
        raise ConfigError("Megatron-Core's TE CP attention needs --transformer-impl "
                          "transformer_engine")

    def language(layer):
        return language_layer_for(layer, transformer_impl, context_parallel, cp_attention,
                                  media_attention, packed)

    return dataclasses.replace(specs, language_layer=language(specs.language_layer),
                               language_moe_layer=language(specs.language_moe_layer))


def language_layer_for(layer: Optional[ModuleSpec], transformer_impl: str,
                       context_parallel: bool = False, cp_attention: str = "ours",
                       media_attention: str = "causal", packed: bool = False
                       ) -> Optional[ModuleSpec]:
    """An LLM layer spec (the package's, or a user's own GPT layer spec) with the core
    attention and mask type the run needs: FlexAttention (``cp_attention`` flex), TE's
    THD attention over packed samples, the CP attention under ``context_parallel``, the
    mask type of ``media_attention``; the spec itself where it needs none."""
    if layer is None:
        return None
    mask_type = language_attn_mask_type(transformer_impl, media_attention,
                                        context_parallel and cp_attention != "none")
    core = None
    if cp_attention == "flex":  # our core attention: it takes the mask codes, no mask type
        core, mask_type = FlexAttention, None
    elif uses_thd(transformer_impl, media_attention, packed, context_parallel):
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        core = thd_attention(TEDotProductAttention)
    elif context_parallel and cp_attention != "none":
        core = (_te_cp_attention() if cp_attention == "transformer_engine"
                else ContextParallelAttention)
    if mask_type is not None \
            and mask_type != layer.submodules.self_attention.params["attn_mask_type"]:
        layer = with_attn_mask_type(layer, mask_type)
    if core is not None:  # a copy along the path to the core attention only (the TE
        attention = copy.copy(layer.submodules.self_attention)  # spec holds closures)
        attention.submodules = dataclasses.replace(attention.submodules,
                                                   core_attention=core)
        layer = dataclasses.replace(layer, submodules=dataclasses.replace(
            layer.submodules, self_attention=attention))
    return layer


def _impl_specs(transformer_impl: str, qk_layernorm: bool, num_experts: Optional[int] = None,
                moe_grouped_gemm: bool = False) -> LayerSpecs:
    if transformer_impl not in TRANSFORMER_IMPLS:
        raise ConfigError(f"--transformer-impl must be one of {TRANSFORMER_IMPLS}, "
                          f"got {transformer_impl!r}")
    if transformer_impl == "transformer_engine":
        require_transformer_engine()
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TENorm,
            TERowParallelLinear,
        )

        return LayerSpecs(
            impl=transformer_impl,
            vision_layer=vit_layer_specs.get_vit_layer_with_transformer_engine_spec(),
            language_layer=get_gpt_layer_with_transformer_engine_spec(
                qk_layernorm=qk_layernorm),
            projector=MLPSubmodules(linear_fc1=TEColumnParallelLinear,
                                    linear_fc2=TERowParallelLinear),
            vision_norm=TENorm,
            language_moe_layer=None if num_experts is None else _moe_layer(
                get_gpt_layer_with_transformer_engine_spec(
                    num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm,
                    qk_layernorm=qk_layernorm)),
        )
    if moe_grouped_gemm:  # Megatron-Core's local spec would quietly build SequentialMLP
        raise ConfigError("--moe-grouped-gemm needs --transformer-impl transformer_engine")
    # Megatron-Core's torch norm refuses sequence parallelism: ours runs it (models/norms.py).
    return LayerSpecs(
        impl=transformer_impl,
        # Checkpoint keys as the TE ViT spec names them (te_names.py).
        vision_layer=with_te_checkpoint_names(with_norm(
            vit_layer_specs.get_vit_layer_with_local_spec(), SequenceParallelNorm)),
        language_layer=with_norm(get_gpt_layer_local_spec(qk_layernorm=qk_layernorm,
                                                          normalization="RMSNorm"),
                                 SequenceParallelNorm),
        projector=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
        vision_norm=SequenceParallelNorm,
        # SequentialMLP: one local MLP per expert.
        language_moe_layer=None if num_experts is None else _moe_layer(with_norm(
            get_gpt_layer_local_spec(num_experts=num_experts, qk_layernorm=qk_layernorm,
                                     normalization="RMSNorm"), SequenceParallelNorm)),
    )


def uses_thd(transformer_impl: str, media_attention: str, packed: bool,
             context_parallel: bool) -> bool:
    """Whether the LLM attends over packed samples with TE's THD varlen attention: TE,
    packed rows, causal media (a bidirectional item is no THD segment: TE takes the dense
    mask as ``arbitrary``), no CP (ours applies the packed mask over the CP split)."""
    return (transformer_impl == "transformer_engine" and packed
            and media_attention == "causal" and not context_parallel)


def _moe_layer(spec):
    """An MoE layer spec with our router (``moe_router.py``) and the checkpoint name of
    its pre-MLP norm as Megatron-Core's TE MoE layer has it (``pre_mlp_layernorm.``: no
    fused norm in front of a router), so checkpoints load across ``--transformer-impl``."""
    mlp = spec.submodules.mlp
    moe = dataclasses.replace(mlp.keywords["submodules"], router=SequenceScaledRouter)
    keys = {k: v for k, v in spec.submodules.sharded_state_dict_keys_map.items()
            if k != "pre_mlp_layernorm."}
    submodules = dataclasses.replace(
        spec.submodules, sharded_state_dict_keys_map=keys,
        mlp=functools.partial(mlp.func, *mlp.args, **{**mlp.keywords, "submodules": moe}))
    return dataclasses.replace(spec, submodules=submodules)


def with_norm(spec, norm: type):
    """A copy of a layer spec with every ``WrappedTorchNorm`` slot built by ``norm``."""
    spec = copy.deepcopy(spec)

    def visit(node) -> None:
        if not dataclasses.is_dataclass(node) or isinstance(node, type):
            return
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if value is WrappedTorchNorm:
                setattr(node, f.name, norm)
            else:
                visit(value)

    visit(spec)
    return spec


def _te_cp_attention():
    """TEDotProductAttention (TE's CP over the config's CP group and ``cp_comm_type``) that
    takes our ``ContextParallelMask``: it carried the zigzag split to the model, TE needs
    no mask for causal attention."""
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    class TEContextParallelAttention(TEDotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None, num_splits=None):
            if isinstance(attention_mask, ContextParallelMask):
                attention_mask = None
            return super().forward(query, key, value, attention_mask, attn_mask_type,
                                   attention_bias=attention_bias,
                                   packed_seq_params=packed_seq_params, num_splits=num_splits)

    return TEContextParallelAttention

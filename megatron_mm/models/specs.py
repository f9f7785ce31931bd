"""Layer specs for every module, chosen in one place: Transformer Engine or local.

``transformer_engine`` needs TE importable and a CUDA device; ``local`` uses only
Megatron-Core's own layers and runs anywhere. Everything else in the package asks this
module for its specs and never imports TE itself.

Context parallelism (``context_parallel=True``) swaps the LLM layers' core attention for
``ContextParallelAttention`` with either impl: Megatron-Core's own CP attention needs TE
and knows only causal masks (and zigzag token splits), ours takes any multimodal mask and
any token assignment. The LLM's ``TransformerConfig`` then keeps ``context_parallel_size=1``
so that no Megatron-Core module applies its own CP (RoPE slicing, the TE-only assert).
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from functools import lru_cache

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

from ..config import ConfigError
from .cp_attention import ContextParallelAttention

TRANSFORMER_IMPLS = ("local", "transformer_engine")


@lru_cache(maxsize=None)
def transformer_engine_available() -> bool:
    if importlib.util.find_spec("transformer_engine") is None or not torch.cuda.is_available():
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # a broken install must fall back, not crash
        return False
    return True


def default_transformer_impl() -> str:
    return "transformer_engine" if transformer_engine_available() else "local"


@dataclass(frozen=True)
class LayerSpecs:
    """The specs of one model: ViT layers, LLM layers, projector linears and norms."""

    impl: str
    vision_layer: ModuleSpec
    language_layer: ModuleSpec
    projector: MLPSubmodules
    vision_norm: type


def get_layer_specs(transformer_impl: str, qk_layernorm: bool = False,
                    context_parallel: bool = False) -> LayerSpecs:
    specs = _impl_specs(transformer_impl, qk_layernorm)
    if not context_parallel:
        return specs
    language_layer = copy.deepcopy(specs.language_layer)
    language_layer.submodules.self_attention.submodules.core_attention = (
        ContextParallelAttention)
    return LayerSpecs(specs.impl, specs.vision_layer, language_layer, specs.projector,
                      specs.vision_norm)


def _impl_specs(transformer_impl: str, qk_layernorm: bool) -> LayerSpecs:
    if transformer_impl not in TRANSFORMER_IMPLS:
        raise ConfigError(f"--transformer-impl must be one of {TRANSFORMER_IMPLS}, "
                          f"got {transformer_impl!r}")
    if transformer_impl == "transformer_engine":
        if not transformer_engine_available():
            raise ConfigError(
                "--transformer-impl transformer_engine needs Transformer Engine and a CUDA "
                "device; install transformer-engine[pytorch] on a GPU machine or pass "
                "--transformer-impl local")
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
        )
    return LayerSpecs(
        impl=transformer_impl,
        vision_layer=vit_layer_specs.get_vit_layer_with_local_spec(),
        language_layer=get_gpt_layer_local_spec(qk_layernorm=qk_layernorm,
                                                normalization="RMSNorm"),
        projector=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
        vision_norm=WrappedTorchNorm,
    )


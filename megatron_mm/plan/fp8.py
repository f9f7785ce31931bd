"""FP8 settings as data: Megatron-LM's FP8 flags, which modules run FP8, and the sequence
padding FP8 GEMMs need.

Pure Python (no torch): the flags are checked, and the padding planned, before any
process group exists. The numbers follow Megatron-Core's ``fp8_utils.get_fp8_align_size``
(16, or 32 for MXFP8) and combine with the sequence- and context-parallel factors by least
common multiple (Megatron-LM's multimodal ``get_padding`` picks one factor and drops FP8's
once SP or CP is on, which leaves FP8 GEMMs unaligned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

from .errors import PlanError

# Megatron-LM's choices (arguments.py, _add_transformer_engine_args).
FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
FP8_AMAX_COMPUTE_ALGOS = ("most_recent", "max")
# What --fp8-emulation reproduces: per-tensor scaling. MXFP8 and blockwise scale blocks of
# 32 / 128 values with their own cast rules; not emulated (a clear error says so).
EMULATED_RECIPES = ("delayed", "tensorwise")
# Largest finite values (TE: Format.E4M3 / E5M2 max_fwd and max_bwd).
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def fp8_align_size(recipe: str) -> int:
    """Tokens an FP8 GEMM's leading dimension must be a multiple of (Megatron-Core's
    ``get_fp8_align_size``)."""
    return 32 if recipe == "mxfp8" else 16


def sequence_multiple(fp8_recipe: Optional[str] = None, tensor_model_parallel_size: int = 1,
                      sequence_parallel: bool = False, context_parallel_size: int = 1,
                      context_parallel_block: Optional[int] = None) -> int:
    """The multiple every LLM sequence is padded to: TP when sequence parallelism splits
    the sequence over TP ranks, 2 x CP (the zigzag split's 2 CP chunks per rank), and with
    FP8 (``fp8_recipe`` None: no FP8 anywhere in the LLM) the FP8 alignment for *each
    rank's* tokens, combined by least common multiple so each one holds at once.

    Each rank's linears see only its shard, S / (CP x TP under SP) rows per sample: TE
    checks the local input before its sequence-parallel all-gather (``module/linear.py``:
    ``assert_dim_for_fp8_exec(inputmat, weight)`` ahead of ``gather_along_first_dim``),
    and MXFP8 quantises that local shard, so the alignment multiplies the split factors.
    Our CP split hands each rank whole blocks of ``context_parallel_block`` tokens (the
    last one short unless the length is a multiple of the block): with FP8 the length is
    one (``cp_block_error`` checks the block itself).
    """
    factors = [1]
    if sequence_parallel:
        factors.append(tensor_model_parallel_size)
    if context_parallel_size > 1:
        factors.append(2 * context_parallel_size)
    if fp8_recipe is not None:
        split = context_parallel_size * (tensor_model_parallel_size if sequence_parallel else 1)
        factors.append(fp8_align_size(fp8_recipe) * split)
        if context_parallel_size > 1 and context_parallel_block:
            factors.append(context_parallel_block)
    return math.lcm(*factors)


def cp_block_error(fp8_recipe: str, tensor_model_parallel_size: int,
                   sequence_parallel: bool, context_parallel_block: int) -> Optional[str]:
    """An FP8 LLM under our CP split: each CP rank's tokens are whole blocks, split again
    over the TP ranks under SP, and TE's FP8 GEMMs take them as rows, so a block must hold
    the FP8 alignment on every TP rank. None when it does."""
    need = fp8_align_size(fp8_recipe) * (tensor_model_parallel_size if sequence_parallel else 1)
    if context_parallel_block % need:
        return (f"--context-parallel-block ({context_parallel_block}) must be a multiple of "
                f"{need} with an FP8 LLM (--fp8-recipe {fp8_recipe}): each CP rank's tokens "
                "are whole blocks, which its FP8 GEMMs take as rows"
                + (" after the sequence-parallel split" if sequence_parallel else ""))
    return None


def encoder_sequence_multiple(fp8_recipe: Optional[str], tensor_model_parallel_size: int,
                              sequence_parallel: bool) -> int:
    """What an encoder that pads its sequence under sequence parallelism (the ViT: patches
    and class token) pads it to: TP, times the FP8 alignment when the encoder or its
    projector runs FP8 (``fp8_recipe``; None: neither), since both run on each rank's
    shard, (tokens + padding) / TP rows per item; 1 without SP."""
    if not sequence_parallel:
        return 1
    align = fp8_align_size(fp8_recipe) if fp8_recipe is not None else 1
    return tensor_model_parallel_size * align


def fp8_gemm_dims_error(shape: Tuple[int, ...], recipe: str) -> Optional[str]:
    """Transformer Engine's check of one FP8 GEMM operand (an input as this rank holds it,
    or a weight shard), or None when it passes. Per-tensor recipes:
    ``pytorch/utils.py: assert_dim_for_fp8_exec``, the product of the leading dims
    divisible by 8 and the last dim by 16 (TE's own message); MXFP8: both by its block of
    32 (``csrc/quantizer.cpp: MXFP8Quantizer::create_tensor``)."""
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if recipe == "mxfp8":
        if rows % 32 or cols % 32:
            return f"MXFP8 requires tensor dims that are divisible by 32 (got shape={list(shape)})"
        return None
    if rows % 8 or cols % 16:
        return ("FP8 execution requires the product of all dimensions except the last to be "
                "divisible by 8 and the last dimension to be divisible by 16, but got tensor "
                f"with dims={list(shape)} (product of leading dims = {rows}, last dim = "
                f"{cols})")
    return None


def weight_shard_rows(recipe: str) -> int:
    """What Transformer Engine needs each rank's FP8 weight shard's rows ([out / TP, in]
    for a column-parallel linear) to be a multiple of: 8 for the per-tensor recipes (the
    leading dims of ``assert_dim_for_fp8_exec``), MXFP8's block of 32 (the columns, the
    in-features, are the GEMM input widths checked with the inputs)."""
    return 32 if recipe == "mxfp8" else 8


def fp8_dtypes(fp8_format: str) -> Tuple[str, str]:
    """(forward, backward) FP8 types: inputs and weights, then output gradients. Hybrid
    takes E5M2's range for gradients; e4m3 uses E4M3 everywhere."""
    return ("e4m3", "e5m2") if fp8_format == "hybrid" else ("e4m3", "e4m3")


# Each ``Fp8Settings`` field of a Megatron-LM flag: (the flag's attribute, the field of
# Megatron-Core's ``TransformerConfig`` it sets), one copy of each name for both directions.
MEGATRON_NAMES = {
    "fp8_format": ("fp8", "fp8"),
    "recipe": ("fp8_recipe", "fp8_recipe"),
    "margin": ("fp8_margin", "fp8_margin"),
    "amax_history_len": ("fp8_amax_history_len", "fp8_amax_history_len"),
    "amax_compute_algo": ("fp8_amax_compute_algo", "fp8_amax_compute_algo"),
    "param_gather": ("fp8_param_gather", "fp8_param"),
    "first_last_layers_bf16": ("first_last_layers_bf16", "first_last_layers_bf16"),
    "num_layers_at_start_in_bf16": ("num_layers_at_start_in_bf16",
                                    "num_layers_at_start_in_bf16"),
    "num_layers_at_end_in_bf16": ("num_layers_at_end_in_bf16", "num_layers_at_end_in_bf16"),
    "tp_only_amax_red": ("tp_only_amax_red", "tp_only_amax_red"),
}


@dataclass(frozen=True)
class Fp8Settings:
    """Megatron-LM's FP8 flags for one run, and the modules they apply to.

    ``modules`` names module keys: ``llm``, an encoder's name (``vision``, ``audio``) or
    ``<encoder>-projector``. ``emulation``: quantise-dequantise on CPU in the local
    layers, not Transformer Engine."""

    fp8_format: str
    recipe: str = "delayed"
    margin: int = 0
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    param_gather: bool = False
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: int = 1
    num_layers_at_end_in_bf16: int = 1
    tp_only_amax_red: bool = False
    modules: Tuple[str, ...] = ("llm",)
    emulation: bool = False

    def applies_to(self, module: str) -> bool:
        return module in self.modules

    def transformer_config_fields(self) -> dict:
        """The FP8 fields of Megatron-Core's ``TransformerConfig`` for an FP8 module."""
        return {field: getattr(self, name) for name, (_, field) in MEGATRON_NAMES.items()}

    def describe(self) -> str:
        how = ("EMULATION (quantise-dequantise in Megatron-Core's local linear layers on "
               "CPU; not Transformer Engine)" if self.emulation else "Transformer Engine")
        detail = f"--fp8-format {self.fp8_format} --fp8-recipe {self.recipe}"
        if self.recipe == "delayed":
            detail += (f" --fp8-amax-history-len {self.amax_history_len} "
                       f"--fp8-amax-compute-algo {self.amax_compute_algo} "
                       f"--fp8-margin {self.margin}")
        return f"FP8 {how}: {detail}; modules {','.join(self.modules)}"


def module_keys(encoders: Iterable[str]) -> Tuple[str, ...]:
    """Every module key ``--fp8-modules`` accepts for a model with these encoders."""
    keys = ["llm"]
    for name in encoders:
        keys += [name, f"{name}-projector"]
    return tuple(keys)


def parse_fp8_modules(flag: str, encoders: Iterable[str]) -> Tuple[str, ...]:
    """``--fp8-modules``: comma-separated module keys, or ``all``."""
    known = module_keys(encoders)
    names = [n.strip() for n in flag.split(",") if n.strip()]
    if names == ["all"]:
        return known
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise PlanError(f"--fp8-modules {flag!r}: unknown module(s) {', '.join(unknown)}; "
                         f"this model has {', '.join(known)} (or all)")
    return tuple(dict.fromkeys(names))

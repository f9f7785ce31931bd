"""FP8 training through Transformer Engine (or its CPU emulation)."""

from dataclasses import dataclass
from typing import Optional

from ....plan.fp8 import FP8_AMAX_COMPUTE_ALGOS, FP8_FORMATS, FP8_RECIPES
from .fields import flag


@dataclass(frozen=True)
class Fp8Args:
    """FP8 training through Transformer Engine (or its CPU emulation)."""

    fp8: Optional[str] = flag(None, choices=list(FP8_FORMATS), arg_names=["--fp8-format"])
    """FP8 for the --fp8-modules through Transformer Engine: e4m3 for every tensor, or hybrid (E4M3
    forward, E5M2 gradients)"""
    fp8_recipe: str = flag("delayed", choices=list(FP8_RECIPES))
    """delayed: scales from the amax history; tensorwise: per-tensor current scaling; mxfp8
    (Blackwell) and blockwise: block scales"""
    fp8_margin: int = 0
    """delayed scaling: scale = fp8_max / amax / 2^margin"""
    fp8_amax_history_len: int = 1
    """delayed scaling: amaxes kept per tensor"""
    fp8_amax_compute_algo: str = flag("most_recent", choices=list(FP8_AMAX_COMPUTE_ALGOS))
    """delayed scaling: the newest amax or the history's max"""
    fp8_param_gather: bool = False
    """keep the FP8 modules' weights in FP8 (TE's fp8_model_init) and all-gather them in FP8; needs
    --use-distributed-optimizer"""
    first_last_layers_bf16: bool = False
    """keep the first and last layers of each FP8 transformer stack in BF16 (not with --fp8-recipe
    delayed)"""
    num_layers_at_start_in_bf16: int = 1
    num_layers_at_end_in_bf16: int = 1
    tp_only_amax_red: bool = False
    """reduce FP8 amaxes over the TP (x CP) group only, not TP x DP x CP"""
    fp8_modules: str = "llm"
    """modules that run FP8, comma-separated: llm, an encoder (vision, audio), <encoder>-projector,
    or all. Frozen encoders often stay BF16"""
    fp8_emulation: bool = False
    """a CPU numerics check instead of Transformer Engine: the FP8 settings applied as
    quantise-dequantise in the local layers' linears (--transformer-impl local; recipes delayed
    and tensorwise)"""

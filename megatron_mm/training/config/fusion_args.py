"""Megatron-LM's ``--no-*-fusion`` flags, with its dests and meanings
(``megatron/training/arguments.py``): each fusion is on unless turned off, and runs where
its kernel exists (``models/fusions.py``). No torch import."""

from __future__ import annotations

import argparse
from typing import Dict

FUSION_FLAGS = {  # dest -> flag
    "masked_softmax_fusion": "--no-masked-softmax-fusion",
    "bias_gelu_fusion": "--no-bias-gelu-fusion",
    "bias_swiglu_fusion": "--no-bias-swiglu-fusion",
    "bias_dropout_fusion": "--no-bias-dropout-fusion",
    "apply_rope_fusion": "--no-rope-fusion",
    "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
}
_HELP = {
    "masked_softmax_fusion": "disable fusion of query_key_value scaling, masking, and "
                             "softmax (Apex's kernels, local attention)",
    "bias_gelu_fusion": "disable bias and gelu fusion (its kernel is tanh GELU: only "
                        "modules whose GELU is that one fuse)",
    "bias_swiglu_fusion": "disable bias and swiglu fusion",
    "bias_dropout_fusion": "disable bias and dropout fusion",
    "apply_rope_fusion": "disable rope fusion (Transformer Engine's fused RoPE, the LLM)",
    "gradient_accumulation_fusion": "disable fusing gradient accumulation to weight "
                                    "gradient computation of linear layers",
}


def add_fusion_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kernel fusions (Megatron-LM's: each on where its kernel "
                             "exists, on CUDA; none without CUDA)")
    for dest, flag in FUSION_FLAGS.items():
        g.add_argument(flag, action="store_false", dest=dest, help=_HELP[dest])


def fusion_flags(fusion) -> Dict[str, bool]:
    """The flags' values (``fusion``: the RunConfig's fusion group)."""
    return {dest: getattr(fusion, dest) for dest in FUSION_FLAGS}

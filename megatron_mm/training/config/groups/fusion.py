"""Megatron-LM's kernel fusions."""

from dataclasses import dataclass
from .fields import flag


@dataclass(frozen=True)
class FusionArgs:
    """Megatron-LM's kernel fusions."""

    masked_softmax_fusion: bool = flag(True, arg_names=["--no-masked-softmax-fusion"])
    """disable fusion of query_key_value scaling, masking, and softmax (Apex's kernels, local
    attention)"""
    bias_gelu_fusion: bool = flag(True, arg_names=["--no-bias-gelu-fusion"])
    """disable bias and gelu fusion (its kernel is tanh GELU: only modules whose GELU is that one
    fuse)"""
    bias_swiglu_fusion: bool = flag(True, arg_names=["--no-bias-swiglu-fusion"])
    """disable bias and swiglu fusion"""
    bias_dropout_fusion: bool = flag(True, arg_names=["--no-bias-dropout-fusion"])
    """disable bias and dropout fusion"""
    apply_rope_fusion: bool = flag(True, arg_names=["--no-rope-fusion"])
    """disable rope fusion (Transformer Engine's fused RoPE, the LLM)"""
    gradient_accumulation_fusion: bool = flag(
        True, arg_names=["--no-gradient-accumulation-fusion"])
    """disable fusing gradient accumulation to weight gradient computation of linear layers"""

"""The hybrid LLM's flags (Qwen3.5), by Megatron-LM's names: Gated DeltaNet layers
(``--experimental-attention-variant gated_delta_net`` and its ``--linear-*`` sizes), gated
attention, partial rotary and zero-centred norms; and the ``LinearAttentionConfig`` they
make. No torch import."""

from __future__ import annotations

from typing import Optional

from ...config import ConfigError, LinearAttentionConfig
from .moe_args import moe_freq_type


def add_linear_attention_args(g) -> None:
    """Into the "language model" group (so the model group carries them)."""
    g.add_argument("--experimental-attention-variant", choices=["gated_delta_net"],
                   default=None,
                   help="gated_delta_net: Megatron-Core's Gated DeltaNet (linear attention) "
                        "in the layers --linear-attention-freq marks, full attention in the "
                        "others (Qwen3.5)")
    g.add_argument("--linear-attention-freq", type=moe_freq_type, default=None,
                   help="an int N: layer i is full attention when (i + 1) %% N == 0, linear "
                        "otherwise; or one 0/1 per layer as a list expression, e.g. "
                        "\"([1]*3+[0])*2\" (1: linear, 0: full)")
    g.add_argument("--linear-conv-kernel-dim", type=int, default=4)
    g.add_argument("--linear-key-head-dim", type=int, default=128)
    g.add_argument("--linear-value-head-dim", type=int, default=128)
    g.add_argument("--linear-num-key-heads", type=int, default=16)
    g.add_argument("--linear-num-value-heads", type=int, default=32)
    g.add_argument("--attention-output-gate", action="store_true",
                   help="gated attention: a sigmoid gate per head on the attention output "
                        "(Qwen3.5's full-attention layers)")
    g.add_argument("--rotary-percent", type=float, default=1.0,
                   help="the share of each head's dimensions RoPE rotates (Qwen3.5: 0.25)")
    g.add_argument("--apply-layernorm-1p", action="store_true",
                   help="norms scale by 1 + weight (zero-centred gamma; Qwen3.5)")


def check_gdn_context_parallel(args) -> None:
    """The GDN layers under ``--context-parallel-size`` > 1 run head-parallel over the CP
    ranks (``models/linear_attention_cp.py``): each TP rank's key and value heads split
    again over CP. No sample length rule: each rank's tokens are padded to the longest
    rank's for the all-to-all, whatever the token assignment."""
    cp, tp = args.context_parallel_size, args.tensor_model_parallel_size
    if cp == 1 or args.experimental_attention_variant is None:
        return
    for flag in ("linear_num_key_heads", "linear_num_value_heads"):
        heads = getattr(args, flag)
        if heads % (tp * cp):
            raise ConfigError(
                f"--context-parallel-size {cp}: the Gated DeltaNet layers split their heads "
                f"over --tensor-model-parallel-size ({tp}) x --context-parallel-size ({cp}); "
                f"--{flag.replace('_', '-')} ({heads}) is not divisible by {tp * cp}")


CHECKPOINT_FLAGS = ("experimental_attention_variant", "linear_attention_freq",
                    "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_num_key_heads", "linear_num_value_heads", "attention_output_gate",
                    "rotary_percent", "apply_layernorm_1p")


def linear_attention_config(model) -> Optional[LinearAttentionConfig]:
    """The GDN layers of the model group's flags; None: every layer full attention."""
    if model.experimental_attention_variant is None:
        if model.linear_attention_freq is not None:
            raise ConfigError("--linear-attention-freq needs --experimental-attention-variant "
                              "gated_delta_net")
        return None
    freq = model.linear_attention_freq
    if freq is None:
        raise ConfigError("--experimental-attention-variant gated_delta_net needs "
                          "--linear-attention-freq (which layers are linear attention)")
    return LinearAttentionConfig(
        linear_attention_freq=freq if isinstance(freq, int) else tuple(freq),
        linear_conv_kernel_dim=model.linear_conv_kernel_dim,
        linear_key_head_dim=model.linear_key_head_dim,
        linear_value_head_dim=model.linear_value_head_dim,
        linear_num_key_heads=model.linear_num_key_heads,
        linear_num_value_heads=model.linear_num_value_heads)

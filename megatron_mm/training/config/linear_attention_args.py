"""The hybrid LLM's flags (Qwen3.5), by Megatron-LM's names: Gated DeltaNet layers
(``--experimental-attention-variant gated_delta_net`` and its ``--linear-*`` sizes), gated
attention, partial rotary and zero-centred norms; and the ``LinearAttentionConfig`` they
make. No torch import."""

from __future__ import annotations

from typing import Optional

from ...config import ConfigError, LinearAttentionConfig


def check_gdn_context_parallel(config) -> None:
    """(``config``: the RunConfig.) The GDN layers under ``--context-parallel-size`` > 1
    run head-parallel over the CP ranks (``models/linear_attention_cp.py``): each TP rank's
    key and value heads split again over CP. No sample length rule: each rank's tokens are
    padded to the longest rank's for the all-to-all, whatever the token assignment."""
    cp, tp = config.parallel.context_parallel_size, config.parallel.tensor_model_parallel_size
    if cp == 1 or config.model.experimental_attention_variant is None:
        return
    for flag in ("linear_num_key_heads", "linear_num_value_heads"):
        heads = getattr(config.model, flag)
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

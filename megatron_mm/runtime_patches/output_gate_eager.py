"""Megatron-Core's gated attention (``attention_output_gate``: Qwen3.5's full-attention
layers) eagerly without CUDA.

Replaces ``megatron.core.transformer.attention.Attention._apply_output_gate`` (megatron-core
0.19.2) with the function it wraps: it is a ``jit_fuser`` (``torch.compile``) method, whose
CPU (inductor C++) compile costs seconds per new shape and changes nothing a CPU run
checks; on CUDA the compiled kernel stays.
"""


def apply() -> None:
    from megatron.core.transformer.attention import Attention

    method = Attention._apply_output_gate
    Attention._apply_output_gate = getattr(method, "_torchdynamo_orig_callable", method)

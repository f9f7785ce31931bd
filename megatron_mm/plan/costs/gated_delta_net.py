"""A Gated DeltaNet layer's token mixer (Qwen3.5, Qwen3-Next): FLOPs, parameters and
activations, O(S) in the sequence length.

Counted from Megatron-Core 0.19.2's ``GatedDeltaNet.forward``
(``megatron/core/ssm/gated_delta_net/gdn.py``), with qk = key heads x key head dim,
v = value heads x value head dim, H = value heads, C = ``chunk_size``, K = the convolution
kernel, per token:

- ``in_proj``: h -> 2 qk + 2 v + 2 H (query, key, value, output gate z, beta, alpha);
- ``conv1d``: a depthwise causal convolution of the 2 qk + v query / key / value channels,
  K multiply-adds per channel (weights, so it has a weight gradient as a linear layer);
- ``out_proj``: v -> h; the gated RMSNorm, the L2 norms, the decay / beta gates:
  elementwise, not counted (as norms are not elsewhere).

The chunked delta rule (``torch_chunk_gated_delta_rule``, the same matmuls as
flash-linear-attention's chunk kernels), query and key repeated up to the H value heads
of dk / dv channels, per chunk of C tokens and head:

- the WY form: K_beta K^T (2 C^2 dk), the triangular solve ((C-1) C (2C-1) / 3),
  A V_beta (2 C^2 dv) and A (K_beta * decay) (2 C^2 dk);
- per chunk against the running state S (dk x dv): Q K^T (2 C^2 dk), W S, Q S and the
  state update K^T V_new (2 C dk dv each), the intra-chunk output A V_new (2 C^2 dv);

so 2 C^2 (3 dk + 2 dv) + 6 C dk dv + (C-1) C (2C-1) / 3 per chunk and head: per token
2 C (3 dk + 2 dv) + 6 dk dv + O(C^2), independent of the sequence length. A sequence is
padded to whole chunks (the kernels compute full chunks), so it costs ceil(S / C) chunks.
The rule has no weights: its backward is two of its forwards, all input gradients (as
attention's core).

Megatron-LM's own count (``megatron/training/training.py``,
``num_floating_point_operations``, the ``is_linear_attention_variant`` branch) charges the
same projections and convolution, and for the rule ``num_v_heads * v_head_dim ** 2 * 4``
multiply-adds per token ("KK^T, VK^T, S(a(I-bKK^T)), and SQ": the token-by-token
recurrence), no chunk term: it counts dk as dv and omits the intra-chunk matmuls, which
at C = 64, dk = dv = 128 are 45 % of the rule's FLOPs here.

Activations kept for backward (bf16 elements per token unless noted; flash-linear-
attention keeps the rule's inputs and its WY matrix and recomputes the chunk states):
the layer input and the normed ``in_proj`` input (2 h), the convolution's input and its
output (the SiLU input; 2 (2 qk + v)), the L2-normed query and key repeated to H heads
(2 H dk), z and v after the SiLU (2 v), beta / alpha (2 H), the fp32 decay and beta (4 H
in bf16 units), the fp32 WY matrix (2 C H), the rule's output and the gated norm's output
(2 v).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..model import LinearAttentionSpec


class MixerCost(NamedTuple):
    """A token mixer per micro-batch: its weights' multiply-adds per token, the FLOPs of
    its weightless core, parameters (norm and biases not included) and activation
    elements per token kept for backward."""

    weights: float
    core: float
    params: float
    act: float


def delta_rule_chunk_flops(la: LinearAttentionSpec) -> float:
    """Forward FLOPs of the chunked delta rule on one chunk of one value head."""
    c, dk, dv = la.chunk_size, la.linear_key_head_dim, la.linear_value_head_dim
    return 2.0 * c * c * (3 * dk + 2 * dv) + 6.0 * c * dk * dv + (c - 1) * c * (2 * c - 1) / 3


def delta_rule_flops(la: LinearAttentionSpec, sequences: int, seq_len: int) -> float:
    """Forward FLOPs of the rule over ``sequences`` sequences of ``seq_len`` tokens."""
    chunks = sequences * math.ceil(seq_len / la.chunk_size)
    return chunks * la.linear_num_value_heads * delta_rule_chunk_flops(la)


def gated_delta_net(la: LinearAttentionSpec, hidden: int, sequences: int, seq_len: int,
                    bias: bool = False) -> MixerCost:
    h, qk, v, heads = hidden, la.qk_dim, la.v_dim, la.linear_num_value_heads
    in_proj = h * (2 * qk + 2 * v + 2 * heads)
    conv = la.linear_conv_kernel_dim * (2 * qk + v)
    out_proj = v * h
    weights = in_proj + conv + out_proj
    # A_log and dt_bias per value head, the gated norm's weight (one head's channels)
    params = weights + 2 * heads + la.linear_value_head_dim
    if bias:
        params += 2 * qk + 2 * v + 2 * heads + h
    act = (2 * h + 2 * (2 * qk + v) + 2 * heads * la.linear_key_head_dim + 2 * v + 2 * heads
           + 4 * heads + 2 * la.chunk_size * heads + 2 * v)
    return MixerCost(weights, delta_rule_flops(la, sequences, seq_len), params, act)

"""Per-layer costs from sizes: forward FLOPs, the two backward parts, parameters, bytes.

All per micro-batch. Matmul FLOPs are 2 x m x n x k. A linear layer's backward is one
input-gradient and one weight-gradient matmul, each as large as its forward. The attention
core (scores and weighted values) has no weights: its backward is two matmuls per forward
matmul, all of them input gradients. So for a transformer layer with linear forward P and
attention-core forward A: F = P + A, dgrad = P + 2A, wgrad = P, and a trainable layer costs
exactly 3F; a frozen layer that passes gradients costs 2F + A (A is a few % of F at the
sequence lengths here).

A Gated DeltaNet layer of a hybrid stack (``TransformerSpec.is_linear``, Qwen3.5) replaces
attention by ``gated_delta_net``'s mixer: linear in the sequence length (its chunked delta
rule's core has no weights either: dgrad = P + 2R, wgrad = P, still 3F trained).

An MoE layer (``TransformerSpec.is_moe``) charges its active parameters: the router, the
top-k experts of ``moe_ffn_hidden_size`` and the shared experts per token; it holds every
expert's parameters. Its expert all-to-alls (``all_to_all_bytes``) are bytes, not FLOPs.

Activation bytes assume bf16, flash attention (no S x S scores kept) and no dropout:
per token 2 x (4h + 2q + 2kv + MLP intermediates); with recompute only the layer input (2h).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

from ..errors import PlanError
from ..model import EncoderSpec, TransformerSpec
from .gated_delta_net import gated_delta_net

BF16 = 2  # bytes
FP32 = 4


class Cost(NamedTuple):
    fwd: float
    dgrad: float
    wgrad: float
    params: float
    act: float
    recompute_act: float
    out: float

    def split(self, ways: int) -> "Cost":
        """Ideal tensor parallelism: every quantity divides by the TP size."""
        return Cost(*(v / ways for v in self))


def attention_pairs(seq_len: int, spans: Sequence[int] = ()) -> int:
    """Query-key pairs of one sequence whose tokens attend within segments of ``spans``
    tokens (a frame, a window; empty: the whole sequence): the core attention's FLOPs grow
    with the sum of the squares, not with the tokens."""
    if not spans:
        return seq_len * seq_len
    if sum(spans) != seq_len:
        raise PlanError(f"attention spans {list(spans)} cover {sum(spans)} tokens, the "
                        f"sequence has {seq_len}")
    return sum(s * s for s in spans)


class Mlp(NamedTuple):
    """A layer's MLP: weights per token (active) and held, and per-token intermediates."""

    active: float  # weights each token multiplies (router, top-k experts, shared experts)
    params: float  # weights held (every expert), biases included
    act: float  # intermediate activations per token


def mlp_weights(t: TransformerSpec, moe: bool) -> Mlp:
    """The dense MLP (``ffn_hidden_size``) or the MoE layer's router, experts and shared
    experts."""
    h, mats = t.hidden_size, (3 if t.gated_linear_unit else 2)
    bias = lambda f: (f * (mats - 1) + h) if t.add_bias_linear else 0  # noqa: E731
    if not moe:
        f = t.ffn_hidden_size
        return Mlp(mats * h * f, mats * h * f + bias(f), mats * f)
    f, shared = t.moe_ffn_hidden_size or t.ffn_hidden_size, \
        t.moe_shared_expert_intermediate_size
    router = h * t.num_experts
    active = router + t.moe_router_topk * mats * h * f + mats * h * shared
    held = (router + t.num_experts * (mats * h * f + bias(f))
            + (mats * h * shared + bias(shared) if shared else 0))
    return Mlp(active, held, mats * (f * t.moe_router_topk + shared))


def expert_params(t: TransformerSpec) -> float:
    """An MoE layer's routed experts' parameters (what expert parallelism splits)."""
    f, mats = t.moe_ffn_hidden_size or t.ffn_hidden_size, (3 if t.gated_linear_unit else 2)
    bias = (f * (mats - 1) + t.hidden_size) if t.add_bias_linear else 0
    return t.num_experts * (mats * t.hidden_size * f + bias)


def all_to_all_bytes(t: TransformerSpec, tokens: float, expert_parallel: int) -> float:
    """Bytes one expert all-to-all (the dispatch, or the combine) of ``tokens`` tokens sends
    off a rank: each token's hidden state to each of its top-k experts, (EP - 1) / EP of
    them on other ranks."""
    if expert_parallel <= 1:
        return 0.0
    return (BF16 * tokens * t.moe_router_topk * t.hidden_size
            * (expert_parallel - 1) / expert_parallel)


class _Mixer(NamedTuple):
    """A layer's token mixer: its weights (multiply-adds per token), weightless core
    FLOPs, parameters with its norm and biases, activation elements per token."""

    weights: float
    core: float
    params: float
    act: float


def _mixer(t: TransformerSpec, sequences: int, seq_len: int, causal: bool,
           spans: Sequence[int], linear: bool) -> _Mixer:
    """Self-attention (QKV, core, output projection; with ``attention_output_gate`` the
    query projection also yields the gate) or, ``linear``, the Gated DeltaNet
    (``gated_delta_net``); each with its pre-norm."""
    h, q, kv = t.hidden_size, t.q_dim, t.kv_dim
    norm = h * (2 if t.add_bias_linear else 1)
    if linear:
        if t.linear_attention is None:
            raise PlanError("a Gated DeltaNet layer needs the stack's linear_attention sizes")
        g = gated_delta_net(t.linear_attention, h, sequences, seq_len, t.add_bias_linear)
        return _Mixer(g.weights, g.core, g.params + norm, g.act)
    gate = q if t.attention_output_gate else 0
    weights = h * (q + gate) + 2 * h * kv + q * h  # QKV (and gate) and output projections
    # QK^T and PV: 2 matmuls of 2*S*S*q each per sequence; causal skips half
    core = 4.0 * sequences * attention_pairs(seq_len, spans) * q * (0.5 if causal else 1.0)
    biases = q + gate + 2 * kv + h if t.add_bias_linear else 0
    return _Mixer(weights, core, weights + norm + biases, 2 * h + 2 * q + 2 * kv + 2 * gate)


def llm_layer(t: TransformerSpec, layer: int, sequences: int, seq_len: int) -> Cost:
    """LLM layer ``layer`` (causal): MoE or dense, Gated DeltaNet or full attention, as
    the stack's patterns say."""
    return transformer_layer(t, sequences, seq_len, True, t.is_moe(layer),
                             linear=t.is_linear(layer))


def transformer_layer(t: TransformerSpec, sequences: int, seq_len: int, causal: bool,
                      moe: Optional[bool] = None, spans: Sequence[int] = (),
                      linear: bool = False) -> Cost:
    """One layer; ``moe`` (default: the stack has experts) whether its MLP is the experts;
    ``spans``: the segments its tokens attend within (``attention_pairs``); ``linear``: a
    Gated DeltaNet layer (O(S): no attention pairs)."""
    h = t.hidden_size
    tokens = sequences * seq_len
    mix = _mixer(t, sequences, seq_len, causal, spans, linear)
    ffn = mlp_weights(t, t.num_experts > 1 if moe is None else moe)
    linear_flops = 2.0 * tokens * (mix.weights + ffn.active)
    core = mix.core
    params = mix.params + ffn.params + h * (2 if t.add_bias_linear else 1)
    act = BF16 * tokens * (mix.act + 2 * h + ffn.act)
    hidden = BF16 * tokens * h
    return Cost(fwd=linear_flops + core, dgrad=linear_flops + 2 * core, wgrad=linear_flops,
                params=params, act=act, recompute_act=hidden, out=hidden)


def attention_pair_share(t: TransformerSpec) -> float:
    """A layer's forward FLOPs of one query-key pair of core attention over those of one
    token's linear layers: how many tokens' work each pair adds (no mask)."""
    whole = transformer_layer(t, 1, 2, causal=False).fwd  # 4 pairs
    apart = transformer_layer(t, 1, 2, causal=False, spans=(1, 1)).fwd  # 2 pairs
    pair = (whole - apart) / 2
    return pair / (apart / 2 - pair)


def transformer_sublayers(t: TransformerSpec, sequences: int, seq_len: int, causal: bool,
                          moe: Optional[bool] = None, spans: Sequence[int] = (),
                          linear: bool = False) -> Tuple[Cost, Cost]:
    """The layer's two kernels Optimus schedules apart: (attention: its norm, QKV, core and
    output projection, or the Gated DeltaNet; MLP: its norm and FFN), which add up to
    ``transformer_layer``."""
    h = t.hidden_size
    tokens = sequences * seq_len
    mix = _mixer(t, sequences, seq_len, causal, spans, linear)
    ffn = mlp_weights(t, t.num_experts > 1 if moe is None else moe)
    attn_linear = 2.0 * tokens * mix.weights
    mlp_linear = 2.0 * tokens * ffn.active
    norm = h * (2 if t.add_bias_linear else 1)
    hidden = BF16 * tokens * h
    attention = Cost(fwd=attn_linear + mix.core, dgrad=attn_linear + 2 * mix.core,
                     wgrad=attn_linear, params=mix.params, act=BF16 * tokens * mix.act,
                     recompute_act=hidden, out=hidden)
    mlp = Cost(fwd=mlp_linear, dgrad=mlp_linear, wgrad=mlp_linear,
               params=ffn.params + norm, act=BF16 * tokens * (2 * h + ffn.act),
               recompute_act=hidden, out=hidden)
    return attention, mlp


def encoder_embed(enc: EncoderSpec, sequences: int) -> Cost:
    """Patch / conv stem plus position embeddings. Its input is data: no input gradient."""
    tokens = sequences * enc.tokens_per_item
    h = enc.transformer.hidden_size
    fwd = tokens * enc.embed_flops_per_token
    stem_input = BF16 * tokens * enc.embed_flops_per_token / (2 * h)  # the stem's matmul input
    return Cost(fwd=fwd, dgrad=0.0, wgrad=fwd, params=enc.embed_params, act=stem_input,
                recompute_act=stem_input, out=BF16 * tokens * h)


def projector(enc: EncoderSpec, llm_hidden: int, sequences: int) -> Cost:
    """LLaVA's MLP (Linear-GELU-Linear) or one Linear, on the tokens handed to the LLM;
    with DeepStack one such merger more per DeepStack layer (their outputs travel as the
    layers' ``deepstack_bytes``, not in ``out``)."""
    mergers = 1 + len(enc.deepstack_layers)
    tokens = sequences * enc.llm_tokens_per_item
    d_in = enc.projector_input_size
    if enc.projector_type == "affine":
        weights, inner = d_in * llm_hidden, 0
        params = weights + llm_hidden
    else:
        inner = enc.projector_ffn_hidden_size or llm_hidden
        weights = d_in * inner + inner * llm_hidden
        params = weights + inner + llm_hidden
    fwd = 2.0 * tokens * weights * mergers
    act = BF16 * tokens * (d_in + 2 * inner) * mergers  # input, GELU input and output
    return Cost(fwd=fwd, dgrad=fwd, wgrad=fwd, params=params * mergers, act=act,
                recompute_act=act, out=BF16 * tokens * llm_hidden)


def llm_embed(t: TransformerSpec, tokens: int) -> Cost:
    """A table lookup (no FLOPs worth counting); its input gradient only routes media
    gradients back to the projectors, a copy."""
    return Cost(fwd=0.0, dgrad=0.0, wgrad=0.0, params=t.vocab_size * t.hidden_size,
                act=0.0, recompute_act=0.0, out=BF16 * tokens * t.hidden_size)


def llm_head(t: TransformerSpec, tokens: int) -> Cost:
    """Final norm, output layer and cross-entropy; the loss keeps fp32 softmax of the logits."""
    h, v = t.hidden_size, t.vocab_size
    fwd = 2.0 * tokens * h * v
    act = BF16 * tokens * h + FP32 * tokens * v
    return Cost(fwd=fwd, dgrad=fwd, wgrad=fwd, params=v * h + h, act=act, recompute_act=act,
                out=0.0)

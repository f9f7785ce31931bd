"""Context parallelism of a hybrid LLM (Qwen3.5: Gated DeltaNet + full attention): each CP
rank's work per layer kind and the Gated DeltaNet layers' all-to-all traffic.

The full-attention layers run on the package's token assignment (``cp_assignment``: whole
blocks per rank, balanced by attention work), as in an all-attention LLM. A Gated DeltaNet
(GDN) layer runs head-parallel, Megatron-Core's GDN context parallelism
(``megatron/core/ssm/gated_delta_net``, ``tensor_a2a_cp2hp`` / ``tensor_a2a_hp2cp``):

1. ``in_proj`` on the rank's own tokens (linear in its token count);
2. an all-to-all from sequence shards to head shards: each rank sends every other rank
   that rank's head group of its tokens' projections (q, k, v, the output gate z, beta,
   alpha: 2 qk + 2 v + 2 H channels per token per TP rank) and receives its own head group
   of every other rank's tokens;
3. the convolution and the chunked delta rule over the whole sequence (each sample from a
   zero state) for the rank's 1 / CP of the heads: the same work on every rank whatever the
   token assignment;
4. the gated norm of its heads, an all-to-all back (v channels per token per TP rank: the
   rank's head group of every token to the token's rank), ``out_proj`` on its own tokens.

So the GDN layers need the key heads (and so the value heads) divisible by TP x CP
(``gdn_cp_error``), add no imbalance of their own beyond their projections, and move per
rank and layer, forward (the backward runs the transposed all-to-alls: as many bytes the
other way; recompute repeats the forward's)::

    sent     = n (CP - 1) / CP x W_in + (S - n) / CP x W_out
    received = (S - n) / CP x W_in + n (CP - 1) / CP x W_out

elements per row, n the rank's tokens of the S in the sequence, W_in = (2 qk + 2 v + 2 H)
/ TP, W_out = v / TP; with n = S / CP both are S (CP - 1) / CP^2 x (W_in + W_out).

``hybrid_cp_balance`` puts one micro-batch's LLM work per rank together: the full layers'
attention core (their tiles under the mask, ``4 block^2 q`` FLOPs a tile), the rank's
tokens through every layer's projections and MLP, and the GDN layers' rule and
convolution per head group. Pure Python + numpy: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..errors import PlanError
from ..model import LinearAttentionSpec, TransformerSpec
from ..record import Record
from ..costs.flops import BF16, mlp_weights
from ..costs.gated_delta_net import delta_rule_flops
from .cp_assignment import BLOCK_OVERHEAD, assign_tokens


def gdn_cp_error(la: LinearAttentionSpec, tensor_model_parallel_size: int,
                 context_parallel_size: int) -> Optional[str]:
    """Why the GDN layers cannot run head-parallel over TP x CP ranks (None: they can):
    each rank takes whole key heads (the value heads, a multiple of them, follow)."""
    tp, cp = tensor_model_parallel_size, context_parallel_size
    if la.linear_num_key_heads % (tp * cp):
        return (f"--linear-num-key-heads ({la.linear_num_key_heads}) is not divisible by "
                f"--tensor-model-parallel-size x --context-parallel-size ({tp} x {cp}): the "
                f"Gated DeltaNet layers run head-parallel over the CP ranks")
    return None


def gdn_channels(la: LinearAttentionSpec, tensor_model_parallel_size: int = 1):
    """(W_in, W_out): the channels per token each GDN all-to-all carries on one TP rank
    (module docstring)."""
    tp = tensor_model_parallel_size
    w_in = 2 * la.qk_dim + 2 * la.v_dim + 2 * la.linear_num_value_heads
    return w_in / tp, la.v_dim / tp


@dataclass
class GdnAllToAll(Record):
    """Bytes one GDN layer's two forward all-to-alls move on one rank."""

    sent: float
    received: float


def gdn_all_to_all(la: LinearAttentionSpec, tokens: float, seq_length: int,
                   context_parallel_size: int, tensor_model_parallel_size: int = 1,
                   rows: int = 1, bytes_per_element: int = BF16) -> GdnAllToAll:
    """One GDN layer's forward all-to-alls on a rank holding ``tokens`` of each row's
    ``seq_length`` tokens (module docstring); nothing at CP 1."""
    cp = context_parallel_size
    if cp <= 1:
        return GdnAllToAll(0.0, 0.0)
    if not 0 <= tokens <= seq_length:
        raise PlanError(f"a CP rank holds {tokens} of the sequence's {seq_length} tokens")
    w_in, w_out = gdn_channels(la, tensor_model_parallel_size)
    n, rest = tokens, seq_length - tokens
    scale = rows * bytes_per_element
    return GdnAllToAll(sent=scale * (n * (cp - 1) / cp * w_in + rest / cp * w_out),
                       received=scale * (rest / cp * w_in + n * (cp - 1) / cp * w_out))


@dataclass
class HybridCPBalance(Record):
    """One micro-batch's forward LLM work per CP rank (FLOPs per TP rank) by kind, and the
    bytes each GDN layer's forward all-to-alls move per rank."""

    method: str
    context_parallel_size: int
    seq_length: int
    full_layers: int
    gdn_layers: int
    tokens: List[int] = field(default_factory=list)
    attention_flops: List[float] = field(default_factory=list)  # the full layers' core
    gdn_flops: List[float] = field(default_factory=list)  # rule + convolution, per head group
    linear_flops: List[float] = field(default_factory=list)  # projections and MLPs
    a2a_sent: List[float] = field(default_factory=list)  # bytes per GDN layer, forward
    a2a_received: List[float] = field(default_factory=list)

    @property
    def total_flops(self) -> List[float]:
        return [a + g + lin for a, g, lin in
                zip(self.attention_flops, self.gdn_flops, self.linear_flops)]

    def imbalance(self, what: str = "total_flops") -> float:
        """max / mean over the ranks (1.0: even) of a per-rank list."""
        values = np.asarray(getattr(self, what), float)
        return float(values.max() / values.mean()) if values.mean() > 0 else 1.0

    @property
    def a2a_bytes(self) -> float:
        """The busiest rank's bytes (sent or received) per GDN layer forward."""
        return max(max(self.a2a_sent, default=0.0), max(self.a2a_received, default=0.0))

    def step_a2a_bytes(self, recompute: bool = False) -> float:
        """The busiest rank's GDN all-to-all bytes over every GDN layer's forward and
        backward (and the recompute's forward)."""
        return self.a2a_bytes * self.gdn_layers * (3 if recompute else 2)


def layer_counts(llm: TransformerSpec):
    """(full-attention layers, GDN layers) of the stack."""
    gdn = sum(llm.is_linear(i) for i in range(llm.num_layers))
    return llm.num_layers - gdn, gdn


def hybrid_cp_balance(llm: TransformerSpec, codes, context_parallel_size: int,
                      method: str = "ours", block: int = 128,
                      block_overhead: float = BLOCK_OVERHEAD,
                      tensor_model_parallel_size: int = 1) -> HybridCPBalance:
    """Per CP rank, the work and the GDN traffic of one micro-batch with mask ``codes``
    ([S] or [B, S]) through ``llm``, its tokens assigned by ``method`` as the runtime does
    (``assign_tokens``: balanced by the attention tiles of the mask)."""
    if llm.linear_attention is None:
        raise PlanError("hybrid_cp_balance needs a hybrid stack (linear_attention sizes)")
    cp, tp = context_parallel_size, tensor_model_parallel_size
    error = gdn_cp_error(llm.linear_attention, tp, cp)
    if error:
        raise PlanError(error)
    codes = np.atleast_2d(np.asarray(codes, np.int64))
    rows, s = codes.shape
    plan = assign_tokens(codes, cp, method, block=block, block_overhead=block_overhead)
    full, gdn = layer_counts(llm)
    la, h = llm.linear_attention, llm.hidden_size
    # per token: the full layers' QKV (+ gate) and output projections, the GDN layers'
    # in_proj and out_proj, every layer's MLP (its active weights)
    gate = llm.q_dim if llm.attention_output_gate else 0
    attn_weights = h * (llm.q_dim + gate) + 2 * h * llm.kv_dim + llm.q_dim * h
    gdn_weights = h * (2 * la.qk_dim + 2 * la.v_dim + 2 * la.linear_num_value_heads) \
        + la.v_dim * h
    mlp = sum(mlp_weights(llm, llm.is_moe(i)).active for i in range(llm.num_layers))
    per_token = 2.0 * (full * attn_weights + gdn * gdn_weights + mlp) / tp
    # each head group's rule and convolution over every row's whole sequence
    conv = 2.0 * la.linear_conv_kernel_dim * (2 * la.qk_dim + la.v_dim) * s * rows
    per_group = gdn * (delta_rule_flops(la, rows, s) + conv) / (tp * cp)
    tile = 4.0 * block * block * llm.q_dim / tp
    tokens = [len(t) for t in plan.tokens]
    if plan.replicated:  # too short to split: every rank runs every token and head
        per_group *= cp
    traffic = [gdn_all_to_all(la, 0 if plan.replicated else n, s, cp, tp, rows)
               for n in tokens]
    return HybridCPBalance(
        method=method, context_parallel_size=cp, seq_length=s, full_layers=full,
        gdn_layers=gdn, tokens=tokens,
        attention_flops=[full * tile * t for t in plan.attention],
        gdn_flops=[per_group] * cp, linear_flops=[per_token * n * rows for n in tokens],
        a2a_sent=[t.sent for t in traffic], a2a_received=[t.received for t in traffic])


def gdn_step_seconds(balance: HybridCPBalance, bandwidth: float, latency_s: float = 0.0,
                     recompute: bool = False) -> float:
    """The GDN all-to-alls of one micro-batch's forward and backward at ``bandwidth``
    bytes/s per GPU (two per layer each way; the busiest rank's bytes)."""
    if balance.context_parallel_size <= 1 or balance.gdn_layers == 0:
        return 0.0
    passes = 3 if recompute else 2
    return balance.gdn_layers * passes * (2 * latency_s + balance.a2a_bytes / bandwidth)

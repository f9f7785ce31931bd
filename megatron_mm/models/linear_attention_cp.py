"""Context parallelism for the Gated DeltaNet layers under this package's token assignment.

Megatron-Core's GDN runs CP head-parallel: an all-to-all turns each rank's sequence shard
of every head into the whole sequence of its share of the heads (``_all_to_all_cp2hp``),
the convolution and the delta rule scan that sequence in order, and the reverse
all-to-all (``_all_to_all_hp2cp``) returns every head of its own tokens to each rank. Its
``forward`` undoes Megatron's zigzag split (every rank chunks r and 2P-1-r of 2P equal
chunks) around the scan. The package's CP splits tokens by its own plan instead
(``ContextParallelMask``: blocks assigned by attention work, unequal counts per rank), so
``SampleIsolatedGDN`` takes this forward under CP: upstream's pieces (its head
permutation, the two all-to-alls, ``get_parameter_local_cp``, the input preparation, the
gate and norm helpers, the FLA kernels) with the package's permutation around the scan:

- in: each rank's rows padded to the longest rank's count (the all-to-all moves equal
  shards), all-to-all, then the padded rows put in natural order (``GDNTokens.slots``);
- out: natural order back to the padded rank-major rows (``GDNTokens.rows``), the reverse
  all-to-all, each rank's padding dropped.

Packed rows (THD): the row's ``cu_seqlens`` are already in natural order, so the kernels
restart the convolution and recurrent state at every sample as without CP; no sample
length needs to divide by anything (Megatron-Core's split needs each a multiple of 2 x CP).

A micro-batch that is not split (too short: every rank holds it all; validation and
generation, which run whole) needs no all-to-all: each rank scans its share of the heads
over every token and the heads are all-gathered over the CP group (backward: each rank's
gradient of a head share summed to its owner, ``cp_gather.gather_rows``).

Constraint (checked up front, ``training/linear_attention_args.check_gdn_context_parallel``):
key and value heads divisible by TP x CP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.ssm.gated_delta_net import gdn as gdn_module
from megatron.core.ssm.gated_delta_net.common import (_build_head_perm_for_split_sections,
                                                      get_parameter_local_cp)
from megatron.core.ssm.mamba_context_parallel import _all_to_all_cp2hp, _all_to_all_hp2cp

from .context_parallel import ContextParallelMask
from .cp_gather import gather_rows
from .host_copy import to_device
from .packed_sequences import PackedSequences


@dataclass
class GDNTokens:
    """Where this micro-batch's tokens sit for the GDN all-to-alls (on the device)."""

    longest: int  # rows per rank in the all-to-all: the most tokens any CP rank holds
    slots: torch.Tensor  # [S] long: natural position -> its row of the [P x longest] rows
    rows: torch.Tensor  # [P x longest] long: row -> natural position (S: padding)
    cu_seqlens: Optional[torch.Tensor]  # [samples + 1] int32, natural order; None: unpacked


@dataclass
class HybridContextParallelMask(ContextParallelMask):
    """A ``ContextParallelMask`` that also tells the GDN layers how to reach natural order
    (the attention layers read it as the plain mask)."""

    gdn: Optional[GDNTokens] = None

    def to(self, device) -> "HybridContextParallelMask":
        out = super().to(device)
        g = self.gdn
        if g is not None:
            g = dataclasses.replace(
                g, slots=to_device(g.slots, device), rows=to_device(g.rows, device),
                cu_seqlens=None if g.cu_seqlens is None else to_device(g.cu_seqlens, device))
        return dataclasses.replace(out, gdn=g)


def with_gdn_tokens(cpm: ContextParallelMask,
                    cu_seqlens: Optional[torch.Tensor] = None) -> HybridContextParallelMask:
    """``cpm`` with its ``GDNTokens``, made on ``cpm``'s device from its rank order and
    counts (no host read); ``cu_seqlens``: a packed row's samples (host, int32)."""
    order, counts = cpm.order, cpm.counts
    longest, total = max(counts), order.shape[0]
    slots = torch.cat([torch.arange(r * longest, r * longest + n, device=order.device)
                       for r, n in enumerate(counts)])
    by_position = torch.empty_like(slots)
    by_position[order] = slots
    rows = torch.full((len(counts) * longest,), total, dtype=torch.long, device=order.device)
    rows[slots] = order
    cu = None if cu_seqlens is None else to_device(cu_seqlens.to(torch.int32), order.device)
    fields = {f.name: getattr(cpm, f.name) for f in dataclasses.fields(ContextParallelMask)}
    return HybridContextParallelMask(**fields, gdn=GDNTokens(longest, by_position, rows, cu))


def to_natural(x: torch.Tensor, tokens: GDNTokens, group) -> torch.Tensor:
    """[S_local, B, D] this rank's tokens, every head -> [S, B, D / P] every token in
    natural order, this rank's share of the heads."""
    x = F.pad(x, (0, 0, 0, 0, 0, tokens.longest - x.shape[0]))
    return _all_to_all_cp2hp(x, group).index_select(0, tokens.slots)


def from_natural(y: torch.Tensor, tokens: GDNTokens, count: int, group) -> torch.Tensor:
    """The way back: [S, B, X] natural order, this rank's heads -> [count, B, X x P]."""
    y = torch.cat([y, y.new_zeros((1,) + y.shape[1:])])  # row S: the padding rows' source
    return _all_to_all_hp2cp(y.index_select(0, tokens.rows), group)[:count]


def gather_heads(y: torch.Tensor, group) -> torch.Tensor:
    """[S, B, X] this rank's heads of every token -> [S, B, X x P] all heads (rank order);
    backward: each rank's share gets the sum of every rank's gradient of it."""
    size = group.size()
    heads = y.movedim(-1, 0).contiguous()
    order = torch.arange(size * heads.shape[0], device=y.device)
    return gather_rows(heads, [heads.shape[0]] * size, order, group).movedim(0, -1)


def _thd_cu_seqlens(packed_seq_params) -> Optional[torch.Tensor]:
    if isinstance(packed_seq_params, PackedSequences):
        packed_seq_params = packed_seq_params.thd
    if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
        return None
    return packed_seq_params.cu_seqlens_q


def head_parallel_forward(gdn, hidden_states: torch.Tensor, attention_mask,
                          packed_seq_params=None):
    """``GatedDeltaNet.forward`` under the CP group ``gdn.pg_collection.cp`` (size > 1)
    for any token assignment: returns (output, bias) as upstream's."""
    if gdn.config.deterministic_mode:
        raise NotImplementedError("the GDN layers' context parallelism runs FLA's kernels "
                                  "(or their CPU stand-ins), not deterministic_mode's")
    group = gdn.pg_collection.cp
    cp, rank = group.size(), group.rank()
    cpm = attention_mask if isinstance(attention_mask, ContextParallelMask) else None
    split = cpm is not None and not cpm.replicated
    tokens = getattr(cpm, "gdn", None)
    if split and tokens is None:
        raise ValueError("a split micro-batch reaches the GDN layers without its GDNTokens "
                         "(models/linear_attention_cp.with_gdn_tokens)")
    cu_seqlens = tokens.cu_seqlens if tokens is not None else _thd_cu_seqlens(
        packed_seq_params)

    qkvzba, _ = gdn.in_proj(hidden_states)  # [S_local, B, in_proj / TP]
    # Upstream's head permutation: one all-to-all then moves each section's head shares.
    perm = _build_head_perm_for_split_sections(gdn.in_proj_split_sections, cp,
                                               qkvzba.device)
    qkvzba = qkvzba.index_select(-1, perm)
    if split:
        count = qkvzba.shape[0]
        qkvzba = to_natural(qkvzba, tokens, group)
    else:  # every token here already: this rank's heads of it
        qkvzba = qkvzba.chunk(cp, dim=-1)[rank]
    seq_len, batch = qkvzba.shape[:2]
    qkvzba = qkvzba.transpose(0, 1)  # [B, S, ...]
    qkv, gate, beta, alpha = torch.split(qkvzba, gdn.feat_dim_split, dim=-1)
    gate = gate.reshape(batch, seq_len, -1, gdn.value_head_dim)

    sections = [gdn.qk_dim_local_tp, gdn.qk_dim_local_tp, gdn.v_dim_local_tp]
    weight = get_parameter_local_cp(gdn.conv1d.weight, dim=0, cp_group=group,
                                    split_sections=sections)
    bias = (get_parameter_local_cp(gdn.conv1d.bias, dim=0, cp_group=group,
                                   split_sections=sections) if gdn.conv_bias else None)
    qkv, _ = gdn_module.causal_conv1d(x=qkv, weight=weight.squeeze(1), bias=bias,
                                      activation=gdn.activation, initial_state=None,
                                      output_final_state=False, cu_seqlens=cu_seqlens)
    a_log = get_parameter_local_cp(gdn.A_log, dim=0, cp_group=group)
    dt_bias = get_parameter_local_cp(gdn.dt_bias, dim=0, cp_group=group)
    query, key, value, gate, beta, alpha = gdn._prepare_input_for_gated_delta_rule(
        qkv, gate, batch, seq_len, beta, alpha)
    g, beta = gdn._compute_g_and_beta(a_log, dt_bias, alpha, beta)
    core, _ = gdn.gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=None,
                                   output_final_state=False, use_qk_l2norm_in_kernel=False,
                                   cu_seqlens=cu_seqlens)
    out = gdn._apply_gated_norm(core, gate).reshape(batch, seq_len, -1)
    out = out.transpose(0, 1).contiguous()  # [S, B, value heads / P x dim]
    if split:
        out = from_natural(out, tokens, count, group)
    else:
        out = gather_heads(out, group)
    return gdn.out_proj(out)

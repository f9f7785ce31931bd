"""The Gated DeltaNet layer under context parallelism (``models/linear_attention_cp.py``)
against the same layer on one rank: outputs, input gradients and parameter gradients (the
CP ranks' summed), for both specs (local, and TE's with stand-ins for TE's linears and
norm, which are not installed here), on the planner's unequal token split of a causal
mask, of packed samples (THD cu_seqlens in natural order), and on a micro-batch every
rank holds whole (too short to split; validation). ``check_gdn_cp`` runs in every rank of
a 2-rank gloo world (after the training runs of ``train_runs`` in the same launch);
``assert_gdn_cp_errors`` judges what it returns."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F

HIDDEN, S, BLOCK = 32, 150, 8
PACKED = (21, 70, 59)  # the second sample spans two chunks of 64


def _te_stand_ins(monkeypatch_target):
    """TE's layer classes the GDN spec names, as local modules with their contract:
    ``TELayerNormColumnParallelLinear`` an RMSNorm (``layer_norm_weight``) fused before a
    column-parallel linear; ``TERowParallelLinear``; ``TENorm`` an RMSNorm."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    class LayerNormColumn(ColumnParallelLinear):
        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size))
            self.eps = config.layernorm_epsilon

        def forward(self, x):
            return super().forward(F.rms_norm(x, (x.shape[-1],), self.layer_norm_weight,
                                              self.eps))

    def norm(config, hidden_size, eps=1e-5, **_):
        return torch.nn.RMSNorm(hidden_size, eps=eps)

    saved = {n: getattr(monkeypatch_target, n, None) for n in
             ("TELayerNormColumnParallelLinear", "TERowParallelLinear", "TENorm")}
    monkeypatch_target.TELayerNormColumnParallelLinear = LayerNormColumn
    monkeypatch_target.TERowParallelLinear = RowParallelLinear
    monkeypatch_target.TENorm = norm
    return saved


def _build(impl: str, pg_collection):
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.linear_attention import gdn_attention_spec

    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, normalization="RMSNorm",
        experimental_attention_variant="gated_delta_net", linear_attention_freq=[1],
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, activation_func=F.silu,
        use_cpu_initialization=True, layernorm_zero_centered_gamma=True)
    torch.manual_seed(0)
    gdn = build_module(gdn_attention_spec(impl), config=config, layer_number=1,
                       pg_collection=pg_collection)
    with torch.no_grad():  # decays and gates spread out, a plain (not 1 + w) output norm
        gdn.A_log.uniform_(-2.0, 0.5)
        gdn.dt_bias.normal_()
        gdn.out_norm.weight.normal_(1.0, 0.3)
        gdn.conv1d.weight.normal_(0.0, 0.5)
    return gdn


def _grads(module) -> dict:
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def _summed(grads: dict, group) -> dict:
    for g in grads.values():
        torch.distributed.all_reduce(g, group=group)
    return grads


def _max_errors(pairs) -> float:
    return max(float((a - b).abs().max()) for a, b in pairs)


def check_gdn_cp(rank: int) -> dict:
    """In a 2-rank gloo world: initialises Megatron's state at CP=2 and returns
    {(impl, case): max abs error} (outputs, input and parameter gradients)."""
    from megatron.core import parallel_state
    from megatron.core.extensions import transformer_engine as te_module
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from megatron_mm.models.context_parallel import context_parallel_mask
    from megatron_mm.models.linear_attention_cp import HybridContextParallelMask, with_gdn_tokens
    from megatron_mm.models.packed_sequences import packed_sequences
    from megatron_mm.plan.context_parallel.attention_mask import mask_codes

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1, context_parallel_size=2)
    model_parallel_cuda_manual_seed(1234)
    cp_group = parallel_state.get_context_parallel_group()
    groups = ProcessGroupCollection.use_mpu_process_groups()
    alone = copy.copy(groups)
    alone.cp = parallel_state.get_data_parallel_group()  # this rank alone: CP 1
    saved = _te_stand_ins(te_module)
    errors, counts = {}, []
    try:
        for impl in ("local", "transformer_engine"):
            cp, ref = _build(impl, groups), _build(impl, alone)
            ref.load_state_dict(cp.state_dict())
            for case in ("causal", "packed", "whole"):
                batch = 1 if case == "packed" else 2
                gen = torch.Generator().manual_seed(3)
                x = torch.randn(S, batch, HIDDEN, generator=gen)
                w = torch.randn(S, batch, HIDDEN, generator=gen)
                cu = torch.tensor(np.cumsum((0,) + PACKED), dtype=torch.int32)
                docs = (torch.repeat_interleave(torch.arange(len(PACKED)),
                                                torch.tensor(PACKED))[None].numpy()
                        if case == "packed" else None)
                xr = x.clone().requires_grad_()
                carrier = packed_sequences(cu) if case == "packed" else None
                out_ref, _ = ref(xr, None, packed_seq_params=carrier)
                (out_ref * w).sum().backward()
                if case == "whole":  # every rank runs it all; CP rank 0 takes the loss
                    xl = x.clone().requires_grad_()
                    out, _ = cp(xl, None)
                    (out * w * (rank == 0)).sum().backward()
                    pairs = [(out, out_ref)]
                    input_grads = [xl.grad]
                else:
                    codes = mask_codes(np.zeros((batch, S), np.int64), {}, docs, "causal")
                    cpm = context_parallel_mask(codes, 2, rank, "ours", BLOCK, cp_group, "cpu")
                    cpm = with_gdn_tokens(cpm, cu if case == "packed" else None)
                    assert isinstance(cpm, HybridContextParallelMask)
                    counts.append(list(cpm.counts))
                    local = cpm.local
                    xl = x[local].clone().requires_grad_()
                    out, _ = cp(xl, cpm)
                    (out * w[local]).sum().backward()
                    pairs = [(out, out_ref[local]), (xl.grad, xr.grad[local])]
                    input_grads = []
                grads = _summed(_grads(cp), cp_group)
                if input_grads:  # the whole input's gradient: summed over the CP ranks
                    torch.distributed.all_reduce(input_grads[0], group=cp_group)
                    pairs.append((input_grads[0], xr.grad))
                pairs += [(grads[n], g) for n, g in _grads(ref).items()]
                errors[(impl, case)] = _max_errors(pairs)
                cp.zero_grad()
                ref.zero_grad()
    finally:
        for name, value in saved.items():
            setattr(te_module, name, value)
        parallel_state.destroy_model_parallel()
    return {"errors": errors, "counts": counts}


def assert_gdn_cp_errors(ranks: list) -> None:
    for out in ranks:
        assert len(out["errors"]) == 6, out["errors"]
        for case, err in out["errors"].items():
            assert err < 1e-5, (case, err)
    assert any(c[0] != c[1] for out in ranks for c in out["counts"]), \
        "no case gave the ranks unequal token counts"


def train_runs(rank: int, runs: list, then=None) -> list:
    """``train_workers.train(rank, argv, grad_steps)`` for each ``(argv, grad_steps)`` in
    turn in this world (one launch for several runs), Megatron's state reset between;
    then ``then(rank)``'s result (a check that needs no launch of its own) appended."""
    from megatron.core import parallel_state
    from train_workers import train

    out = []
    for argv, grad_steps in runs:
        try:
            out.append(train(rank, argv, grad_steps))
        finally:
            parallel_state.destroy_model_parallel()
    if then is not None:
        out.append(then(rank))
    return out

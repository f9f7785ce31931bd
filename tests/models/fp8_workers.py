"""Rank workers for the FP8 emulation's distributed tests (imported by the fork server)."""

import torch
import torch.nn.functional as F


def _linear(cls, config, full_weight, tp_rank, tp, dim):
    from megatron_mm.models.fp8_emulation import emulate_linears

    kw = dict(gather_output=False) if dim == 0 else dict(input_is_parallel=True,
                                                         skip_bias_add=False)
    linear = cls(32, 32, config=config, init_method=torch.nn.init.zeros_, bias=False, **kw)
    with torch.no_grad():
        linear.weight.copy_(full_weight.chunk(tp, dim=dim)[tp_rank])
    emulate_linears(linear)
    return linear


def _run(linear, x):
    """A forward in the emulated autocast Megatron-Core would enter around the layer."""
    from megatron_mm.models.fp8_emulation import emulated_autocast

    with emulated_autocast(linear.config):
        return linear(x)[0]


def amax_groups(rank):
    """TP=2 then DP=2 on two ranks: which amaxes the emulation reduces, and over which
    group (Megatron-Core's amax reduction group: TP x DP x CP, or TP x CP with
    tp_only_amax_red)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.fp8_emulation import current_scale, delayed_meta, quantize_dequantize

    torch.distributed.init_process_group("gloo")
    out = {}
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(32, 32, generator=gen)  # TE: a weight shard 16 wide
    x = torch.randn(8, 1, 32, generator=gen)  # TE: rows a multiple of 8

    def config(tp, recipe="delayed", **kw):
        return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                                 tensor_model_parallel_size=tp, fp8="hybrid", fp8_recipe=recipe,
                                 fp8_amax_history_len=2, use_cpu_initialization=True,
                                 gradient_accumulation_fusion=False, **kw)

    parallel_state.initialize_model_parallel(2, 1)
    # Column: weight rows split; row: weight columns and the input split. Delayed scaling
    # reduces every amax over the group, so each rank holds the whole tensor's.
    col = _linear(ColumnParallelLinear, config(2), w, rank, 2, 0)
    y = _run(col, x.clone().requires_grad_())
    y.backward(torch.ones_like(y) * (rank + 1))  # output-gradient shards differ
    row = _linear(RowParallelLinear, config(2), w, rank, 2, 1)
    _run(row, x.chunk(2, dim=-1)[rank].contiguous())
    out["column"] = delayed_meta(col).amax_history[1].tolist()
    out["column_grad"] = delayed_meta(col, forward=False).amax_history[1].tolist()
    out["row"] = delayed_meta(row).amax_history[1].tolist()
    # Current scaling: each tensor scaled by its own (shard's) amax, as TE does.
    cur = _linear(ColumnParallelLinear, config(2, "tensorwise"), w, rank, 2, 0)
    y = _run(cur, x)
    shard = w.chunk(2, dim=0)[rank]
    ref = F.linear(quantize_dequantize(x, current_scale(x.abs().amax(), "e4m3"), "e4m3"),
                   quantize_dequantize(shard, current_scale(shard.abs().amax(), "e4m3"), "e4m3"))
    out["tensorwise_local"] = torch.equal(y, ref)
    # Sequence parallelism: TE checks each rank's shard before its all-gather (8 rows
    # gathered from 4 here fail; 16 from 8 pass)
    sp = _linear(ColumnParallelLinear, config(2, sequence_parallel=True), w, rank, 2, 0)
    try:
        _run(sp, x[:4].clone())
        out["sp_shard_error"] = None
    except ValueError as e:
        out["sp_shard_error"] = str(e)
    out["sp_rows"] = _run(sp, x.clone()).shape[0]
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(1, 1)  # DP = 2: ranks see different inputs
    xr = x * (rank + 1)
    for only_tp in (False, True):
        lin = _linear(ColumnParallelLinear, config(1, tp_only_amax_red=only_tp), w, 0, 1, 0)
        _run(lin, xr)
        out[f"dp_input_tp_only={only_tp}"] = delayed_meta(lin).amax_history[1, 0].item()
    parallel_state.destroy_model_parallel()
    out["x_amax"], out["w_amax"] = x.abs().amax().item(), w.abs().amax().item()
    out["w_shard_amax"] = w.chunk(2, dim=0)[rank].abs().amax().item()
    return out

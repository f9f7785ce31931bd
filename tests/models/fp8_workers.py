"""Rank workers for the FP8 emulation's distributed tests (imported by the fork server)."""

import torch
import torch.nn.functional as F


def _linear(cls, config, full_weight, tp_rank, tp, dim):
    from megatron_mm.models.fp8_emulation import attach_amax_reduction, emulate_linears

    kw = dict(gather_output=False) if dim == 0 else dict(input_is_parallel=True,
                                                         skip_bias_add=False)
    linear = cls(16, 16, config=config, init_method=torch.nn.init.zeros_, bias=False, **kw)
    with torch.no_grad():
        linear.weight.copy_(full_weight.chunk(tp, dim=dim)[tp_rank])
    emulate_linears(linear)
    linear.amax_reduction = attach_amax_reduction(linear)
    return linear


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
    w = torch.randn(16, 16, generator=gen)
    x = torch.randn(4, 1, 16, generator=gen)

    def config(tp, recipe="delayed", **kw):
        return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                                 tensor_model_parallel_size=tp, fp8="hybrid", fp8_recipe=recipe,
                                 fp8_amax_history_len=2, use_cpu_initialization=True,
                                 gradient_accumulation_fusion=False, **kw)

    parallel_state.initialize_model_parallel(2, 1)
    # Column: weight rows split; row: weight columns and the input split. Delayed scaling
    # reduces every amax over the group, so each rank holds the whole tensor's.
    col = _linear(ColumnParallelLinear, config(2), w, rank, 2, 0)
    y, _ = col(x.clone().requires_grad_())
    y.backward(torch.ones_like(y) * (rank + 1))  # output-gradient shards differ
    col.amax_reduction.update(forward=False)  # what the next backward's start does
    row = _linear(RowParallelLinear, config(2), w, rank, 2, 1)
    row(x.chunk(2, dim=-1)[rank].contiguous())
    out["column"] = delayed_meta(col).amax_history[1].tolist()
    out["column_grad"] = delayed_meta(col, forward=False).amax_history[1].tolist()
    out["row"] = delayed_meta(row).amax_history[1].tolist()
    # Current scaling: each tensor scaled by its own (shard's) amax, as TE does.
    cur = _linear(ColumnParallelLinear, config(2, "tensorwise"), w, rank, 2, 0)
    y, _ = cur(x)
    shard = w.chunk(2, dim=0)[rank]
    ref = F.linear(quantize_dequantize(x, current_scale(x.abs().amax(), "e4m3"), "e4m3"),
                   quantize_dequantize(shard, current_scale(shard.abs().amax(), "e4m3"), "e4m3"))
    out["tensorwise_local"] = torch.equal(y, ref)
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(1, 1)  # DP = 2: ranks see different inputs
    xr = x * (rank + 1)
    for only_tp in (False, True):
        lin = _linear(ColumnParallelLinear, config(1, tp_only_amax_red=only_tp), w, 0, 1, 0)
        lin(xr)
        out[f"dp_input_tp_only={only_tp}"] = delayed_meta(lin).amax_history[1, 0].item()
    parallel_state.destroy_model_parallel()
    out["x_amax"], out["w_amax"] = x.abs().amax().item(), w.abs().amax().item()
    out["w_shard_amax"] = w.chunk(2, dim=0)[rank].abs().amax().item()
    return out


def skipped_module(rank):
    """DP=2: rank 1's micro-batch skips the second linear (an encoder without its media).
    The chunk-level reduction still pairs up, and both ranks end with the same state."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.fp8_emulation import attach_amax_reduction, emulate_linears

    torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1)
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               fp8="hybrid", fp8_amax_history_len=3,
                               use_cpu_initialization=True, gradient_accumulation_fusion=False)

    class Chunk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = (ColumnParallelLinear(16, 16, config=config, bias=False,
                                                   init_method=torch.nn.init.ones_,
                                                   gather_output=False) for _ in range(2))

        def forward(self, x, skip_b):
            y, _ = self.a(x)
            if not skip_b:
                y = y + self.b(x)[0]
            return y

    chunk = Chunk()
    emulate_linears(chunk)
    attach_amax_reduction(chunk)
    for step in range(3):
        x = torch.full((2, 1, 16), float(step + 1), requires_grad=True)
        chunk(x, skip_b=rank == 1 and step != 1).sum().backward()
    emus = [chunk.a.fp8_emulation, chunk.b.fp8_emulation]
    return {"fwd": [e.fwd.amax_history.tolist() for e in emus],
            "fwd_scale": [e.fwd.scale.tolist() for e in emus],
            "bwd": [e.bwd.amax_history.tolist() for e in emus]}

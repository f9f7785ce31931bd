"""flash-linear-attention's varlen kernels without host syncs (``make gpu-check``'s
``fla`` check, where FLA imports): given the packed samples' lengths on the host
(``cu_seqlens_cpu``, FLA's PR 775) ``causal_conv1d`` and ``chunk_gated_delta_rule`` run
forward and backward under ``torch.cuda.set_sync_debug_mode("error")``; with the device
copy only they read it back (counted, printed). The package's GDN layer on packed samples
(``SampleIsolatedGDN``, the carrier's host copy passed on) gives the output of the same
layer without it."""

import importlib.util
import warnings

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("fla") is None,
    reason="needs CUDA and flash-linear-attention")

LENGTHS = (100, 37, 211)  # not chunk (64) multiples


def _syncs(fn) -> int:
    """CUDA sync-debug warnings while ``fn`` runs (and synchronises at its end)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _kernels(cu, cu_cpu):
    from fla.modules.convolution import causal_conv1d
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    g = torch.Generator(device="cuda").manual_seed(0)
    t, heads, dim = sum(LENGTHS), 4, 64
    x = torch.randn(1, t, 3 * heads * dim, device="cuda", dtype=torch.bfloat16, generator=g,
                    requires_grad=True)
    weight = torch.randn(3 * heads * dim, 4, device="cuda", dtype=torch.bfloat16,
                         generator=g, requires_grad=True)
    gate = -torch.rand(1, t, heads, device="cuda", generator=g)
    beta = torch.rand(1, t, heads, device="cuda", dtype=torch.bfloat16, generator=g)
    extra = {} if cu_cpu is None else {"cu_seqlens_cpu": cu_cpu}

    def run():
        y, _ = causal_conv1d(x, weight, activation="silu", cu_seqlens=cu, **extra)
        q, k, v = (p.reshape(1, t, heads, dim) for p in y.chunk(3, -1))
        o, _ = chunk_gated_delta_rule(q, k, v, gate, beta, use_qk_l2norm_in_kernel=True,
                                      cu_seqlens=cu, **extra)
        o.float().square().sum().backward()
        return o
    return run


def test_fla_kernels_with_host_lengths_sync_nothing():
    from fla.modules.convolution import causal_conv1d
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from megatron_mm.models.fla_host_lengths import takes_host_lengths

    if not (takes_host_lengths(causal_conv1d) and takes_host_lengths(chunk_gated_delta_rule)):
        pytest.fail("this FLA predates cu_seqlens_cpu (its PR 775): upgrade it")
    cu_cpu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    cu = cu_cpu.cuda()
    _kernels(cu, cu_cpu)()  # Triton's compiles and autotuning first
    _kernels(cu, None)()
    device_only = _syncs(_kernels(cu, None))
    print(f"FLA varlen syncs: {device_only} with cu_seqlens only")
    torch.cuda.set_sync_debug_mode("error")
    try:
        _kernels(cu, cu_cpu)()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print("FLA varlen syncs: 0 with cu_seqlens_cpu")


def test_gdn_layer_passes_the_host_lengths(cuda_world):
    import dataclasses

    import torch.nn.functional as F
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.linear_attention import gdn_attention_spec
    from megatron_mm.models.packed_sequences import packed_sequences

    config = TransformerConfig(
        num_layers=1, hidden_size=256, num_attention_heads=4, normalization="RMSNorm",
        experimental_attention_variant="gated_delta_net", linear_attention_freq=[1],
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, activation_func=F.silu,
        params_dtype=torch.bfloat16, bf16=True)
    gdn = build_module(gdn_attention_spec("local"), config=config, layer_number=1,
                       pg_collection=ProcessGroupCollection.use_mpu_process_groups()).cuda()
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    carrier = packed_sequences(cu).to("cuda")
    x = torch.randn(sum(LENGTHS), 1, 256, device="cuda", dtype=torch.bfloat16)
    without = dataclasses.replace(carrier, cu_seqlens_cpu=None)
    expected, _ = gdn(x, None, packed_seq_params=without)
    got = {}

    def run():
        got["out"], _ = gdn(x, None, packed_seq_params=carrier)
        got["out"].float().square().sum().backward()
    syncs = _syncs(run)
    print(f"GDN layer syncs (forward and backward, packed): {syncs}")
    torch.testing.assert_close(got["out"], expected)

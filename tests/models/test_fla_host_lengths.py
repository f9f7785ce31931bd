"""FLA's varlen kernels get the packed samples' lengths on the host (``cu_seqlens_cpu``,
FLA's PR 775) from the GDN layer the hybrid LLM builds: fake FLA kernels with FLA's
signatures record the keywords Megatron-Core's ``GatedDeltaNet`` calls them with (and
run the CPU stand-ins). Kernels without the keyword (an FLA before it, the stand-ins)
are called as before. Before: ``cu_seqlens`` only, so FLA read the device copy back."""

import torch
from test_linear_attention import HIDDEN, LENGTHS, _gdn


def _fake_fla(calls):
    from megatron_mm.runtime_patches import gated_delta_net as stand_in

    def causal_conv1d(x, weight, bias=None, residual=None, initial_state=None,
                      output_final_state=False, activation=None, backend="triton",
                      cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, **kwargs):
        calls.append(("causal_conv1d", cu_seqlens, cu_seqlens_cpu))
        return stand_in.causal_conv1d(x, weight, bias, activation=activation,
                                      cu_seqlens=cu_seqlens)

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False,
                               cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                               **kwargs):
        calls.append(("chunk_gated_delta_rule", cu_seqlens, cu_seqlens_cpu))
        return stand_in.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                               output_final_state, use_qk_l2norm_in_kernel,
                                               cu_seqlens=cu_seqlens)

    return causal_conv1d, chunk_gated_delta_rule


def test_fla_kernels_get_the_host_lengths(gloo_world, monkeypatch):
    from megatron.core.ssm.gated_delta_net import gdn as gdn_module

    from megatron_mm.models.packed_sequences import packed_sequences

    x = torch.randn(sum(LENGTHS), 1, HIDDEN, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int32)
    carrier = packed_sequences(cu)
    before, _ = _gdn()(x, None, packed_seq_params=carrier)  # the stand-ins: no keyword

    calls = []
    conv, rule = _fake_fla(calls)
    monkeypatch.setattr(gdn_module, "causal_conv1d", conv)
    monkeypatch.setattr(gdn_module, "chunk_gated_delta_rule", rule)
    gdn = _gdn()
    out, _ = gdn(x, None, packed_seq_params=carrier.to("cpu"))
    assert [name for name, _, _ in calls] == ["causal_conv1d", "chunk_gated_delta_rule"]
    for name, device_cu, host_cu in calls:
        assert host_cu is carrier.cu_seqlens_cpu, name
        assert host_cu.device.type == "cpu" and torch.equal(host_cu, device_cu), name
    torch.testing.assert_close(out, before)
    calls.clear()
    gdn(x[:LENGTHS[0]], None)  # unpacked: no lengths at all
    assert [c[1:] for c in calls] == [(None, None), (None, None)]

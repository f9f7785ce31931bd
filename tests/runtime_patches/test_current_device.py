"""Patch ``current_device``: ``torch.cuda.current_device()`` is the CPU without CUDA."""

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.pipeline_parallel import p2p_communication

CUDA_MISSING = "Torch not compiled with CUDA enabled"


def test_upstream_fails(upstream):
    upstream.raised("current_device", "AssertionError", CUDA_MISSING)
    upstream.raised("rope", "AssertionError", CUDA_MISSING,
                    where=("rotary_pos_embedding.py", "torch.cuda.current_device()"))
    upstream.raised("p2p_recv_buffer", "AssertionError", CUDA_MISSING,
                    where=("p2p_communication.py", "device=torch.cuda.current_device()"))
    upstream.raised("ddp_build", "AssertionError", CUDA_MISSING,
                    where=("param_and_grad_buffer.py", "device=torch.cuda.current_device()"))


def test_current_device_is_cpu():
    assert torch.cuda.current_device() == torch.device("cpu")
    assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"


def test_rotary_embedding_forward():
    dim, seq, base = 8, 5, 10000
    rope = RotaryEmbedding(kv_channels=dim, rotary_percent=1.0, rotary_base=base)
    emb = rope(seq)
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    expected = torch.cat([freqs, freqs], dim=-1)[:, None, None, :]
    assert emb.device.type == "cpu" and emb.shape == (seq, 1, 1, dim)
    torch.testing.assert_close(emb, expected, rtol=1e-6, atol=1e-6)


def test_p2p_receive_buffers(gloo_world, tiny_config, monkeypatch):
    """``P2PCommunicator._communicate`` allocates receive buffers on ``current_device()``.
    One rank cannot send to itself over gloo, so the transport is a loopback here."""
    sent = []

    def loopback(*, tensor_send_prev, tensor_recv_prev, tensor_send_next, tensor_recv_next,
                 group, prev_pipeline_rank, next_pipeline_rank):
        with torch.no_grad():
            if tensor_recv_prev is not None:
                tensor_recv_prev.copy_(tensor_send_next)
            if tensor_recv_next is not None:
                tensor_recv_next.copy_(tensor_send_prev)
        sent.append((tensor_send_next, tensor_send_prev))
        return []

    monkeypatch.setattr(p2p_communication, "_batched_p2p_ops", loopback)
    comm = p2p_communication.P2PCommunicator(
        pp_group=gloo_world.get_pipeline_model_parallel_group(), config=tiny_config)
    x = torch.arange(6.0).reshape(2, 3)
    recv_prev, recv_next, _ = comm._communicate(
        tensor_send_next=x, tensor_send_prev=2 * x, recv_prev=True, recv_next=True,
        tensor_shape=(2, 3))
    assert len(sent) == 1
    for buf, want in ((recv_prev, x), (recv_next, 2 * x)):
        assert buf.device.type == "cpu" and buf.requires_grad
        assert buf.dtype == tiny_config.pipeline_dtype and torch.equal(buf.detach(), want)


def test_ddp_buffers(gloo_world, make_tiny):
    model = make_tiny(0)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    for buffer in ddp.buffers:
        assert buffer.grad_data.device.type == "cpu"
    assert all(p.main_grad.device.type == "cpu" for p in model.parameters())

"""Patch ``rng``: Megatron's model-parallel RNG tracker on the CPU generator."""

import pytest
import torch
from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import random as mrandom

CUDA_MISSING = "Torch not compiled with CUDA enabled"
SEED = 1234
# model_parallel_cuda_manual_seed(seed) at TP rank 0, EP rank 0, ETP rank 0.
STREAM_SEEDS = {
    "data-parallel-rng": SEED,
    "model-parallel-rng": SEED + 2718,
    "expert-parallel-rng": SEED + 1024,
}


def test_upstream_fails(upstream):
    upstream.raised("rng_seed", "AssertionError", CUDA_MISSING,
                    where=("random.py", "orig_rng_state = torch.cuda.get_rng_state()"))
    upstream.raised("rng_fork", "Exception", "cuda rng state model-parallel-rng is not added")
    upstream.raised("rng_checkpoint", "AssertionError", CUDA_MISSING,
                    where=("random.py", "torch.cuda.random.get_rng_state"))


def _reference(seed, n, skip=0):
    gen = torch.Generator().manual_seed(seed)
    if skip:
        torch.rand(skip, generator=gen)
    return torch.rand(n, generator=gen)


def test_tracker_streams(gloo_world):
    mrandom.model_parallel_cuda_manual_seed(SEED)
    tracker = mrandom.get_cuda_rng_tracker()
    assert set(STREAM_SEEDS) <= set(tracker.get_states())

    torch.manual_seed(99)
    default_state = torch.get_rng_state()
    draws = {}
    for name, seed in STREAM_SEEDS.items():
        with tracker.fork(name):
            draws[name] = torch.rand(8)
        # fork() restores the default stream, untouched by what happened inside
        assert torch.equal(torch.get_rng_state(), default_state), name
        assert torch.equal(draws[name], _reference(seed, 8)), name
    names = list(draws)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.equal(draws[a], draws[b]), (a, b)

    # each stream continues where it stopped, nested forks included
    with tracker.fork("model-parallel-rng"):
        first = torch.rand(4)
        with tracker.fork("data-parallel-rng"):
            inner = torch.rand(4)
        second = torch.rand(4)
    assert torch.equal(torch.cat([first, second]), _reference(STREAM_SEEDS["model-parallel-rng"],
                                                              8, skip=8))
    assert torch.equal(inner, _reference(STREAM_SEEDS["data-parallel-rng"], 4, skip=8))
    assert torch.equal(torch.get_rng_state(), default_state)
    assert torch.equal(torch.rand(3), _reference(99, 3))

    with pytest.raises(Exception, match="is not added"):
        with tracker.fork("no-such-stream"):
            pass


def test_checkpoint_recompute_gives_the_same_gradients(gloo_world):
    mrandom.model_parallel_cuda_manual_seed(4321)
    tracker = mrandom.get_cuda_rng_tracker()
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)).requires_grad_()
    x0 = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    tracker_states = {k: v.clone() for k, v in tracker.get_states().items()}

    def block(x):
        h = torch.nn.functional.dropout(x @ w, p=0.5, training=True)  # default stream
        with tracker.fork():  # model-parallel stream, as in TP-region dropout
            h = torch.nn.functional.dropout(h, p=0.5, training=True)
        return torch.tanh(h @ w)

    def run(recompute):
        torch.manual_seed(7)
        tracker.set_states({k: v.clone() for k, v in tracker_states.items()})
        w.grad = None
        x = x0.clone().requires_grad_()
        out = tensor_parallel.checkpoint(block, False, x) if recompute else block(x)
        # Advance every stream between forward and backward: the recompute must replay
        # the forward's draws, not the current ones.
        torch.rand(10)
        with tracker.fork():
            torch.rand(10)
        before_backward = torch.get_rng_state()
        out.pow(2).sum().backward()
        assert torch.equal(torch.get_rng_state(), before_backward)
        return out.detach(), x.grad, w.grad.clone()

    plain = run(recompute=False)
    recomputed = run(recompute=True)
    assert (plain[0] == 0).any(), "dropout should have dropped something"
    for a, b in zip(plain, recomputed):
        assert torch.equal(a, b)

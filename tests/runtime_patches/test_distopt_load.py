"""Patch ``distopt_load``: DistributedOptimizer checkpoints with torch's AdamW, loaded into a
fresh model and optimizer, continue bit-identically to an uninterrupted run."""

import pytest
import torch
from megatron.core import dist_checkpointing
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

KINDS = ("fully_reshardable", "dp_reshardable")
SAVE_AT = 3  # iterations before the checkpoint
AFTER = 2  # iterations after it
BATCHES = [torch.randn(5, 4, generator=torch.Generator().manual_seed(i))
           for i in range(SAVE_AT + AFTER)]


def test_upstream_fails(upstream):
    # (d) a fresh optimizer cannot even produce the template to load into
    upstream.raised("distopt_fresh_sharded_state_dict", "AssertionError",
                    where=("distrib_optimizer.py", "assert len(steps) == 1"))
    # (b) and (a), even when the optimizer has stepped before loading
    upstream.raised("distopt_load_fully_reshardable", "KeyError", "'step'",
                    where=("distrib_optimizer.py", "tensors[key]"))
    upstream.raised("distopt_load_dp_reshardable", "RuntimeError",
                    "a view of a leaf Variable that requires grad is being used in an in-place "
                    "operation", where=("distrib_optimizer.py", "copy_(tensors[key])"))
    # (c) one shared ``step`` tensor: one iteration advances it once per parameter
    shared = upstream.value("distopt_shared_step")
    assert shared["distinct_step_tensors"] == 1 and shared["params"] > 1
    advanced = [a - b for a, b in zip(shared["after"], shared["before"])]
    assert advanced == [shared["params"]] * shared["params"]


def _build(make_tiny, seed):
    model = make_tiny(seed)
    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.1, clip_grad=1.0,
                        use_distributed_optimizer=True), [ddp])
    assert [type(o) for o in opt.chained_optimizers] == [DistributedOptimizer]
    return model, ddp, opt


def _train(ddp, opt, iteration):
    ddp.zero_grad_buffer()
    opt.zero_grad()
    ddp(BATCHES[iteration]).pow(2).mean().backward()
    ddp.finish_grad_sync()
    ok, _, _ = opt.step()
    assert ok


def _inner_state(opt):
    return list(opt.chained_optimizers[0].optimizer.state.values())


def _steps(opt):
    states = _inner_state(opt)
    assert len({id(s["step"]) for s in states}) == len(states), "step tensors must be per param"
    return [s["step"].item() for s in states]


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    states = [{k: v.clone() for k, v in s.items()} for s in _inner_state(opt)]
    return params, states


def _metadata(kind):
    return {"distrib_optim_sharding_type": kind}


@pytest.fixture(scope="module")
def uninterrupted(gloo_world, make_tiny, tmp_path_factory):
    """Train SAVE_AT + AFTER iterations, checkpointing (both formats) after SAVE_AT."""
    model, ddp, opt = _build(make_tiny, seed=0)
    steps, paths = [], {}
    for it in range(SAVE_AT + AFTER):
        if it == SAVE_AT:
            saved = _snapshot(model, opt)
            for kind in KINDS:
                paths[kind] = str(tmp_path_factory.mktemp(kind))
                msd = model.sharded_state_dict()
                dist_checkpointing.save(
                    {"model": msd,
                     "optimizer": opt.sharded_state_dict(msd, metadata=_metadata(kind))},
                    paths[kind])
        _train(ddp, opt, it)
        steps.append(_steps(opt))
    return {"paths": paths, "saved": saved, "final": _snapshot(model, opt), "steps": steps}


def test_adamw_step_is_per_param_and_counts_iterations(uninterrupted):
    n = len(uninterrupted["saved"][0])
    assert uninterrupted["steps"] == [[float(it + 1)] * n for it in range(SAVE_AT + AFTER)]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_is_bit_identical(uninterrupted, make_tiny, kind):
    model, ddp, opt = _build(make_tiny, seed=1)  # different weights, empty optimizer state
    saved_params, saved_states = uninterrupted["saved"]
    assert not any(torch.equal(p, s) for p, s in zip(model.parameters(), saved_params))

    msd = model.sharded_state_dict()
    template = {"model": msd, "optimizer": opt.sharded_state_dict(
        msd, is_loading=True, metadata=_metadata(kind))}
    state = dist_checkpointing.load(template, uninterrupted["paths"][kind])
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])

    params, states = _snapshot(model, opt)
    assert _steps(opt) == [float(SAVE_AT)] * len(params)
    for p, s in zip(params, saved_params):
        assert torch.equal(p, s)
    for got, want in zip(states, saved_states):
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key

    for it in range(SAVE_AT, SAVE_AT + AFTER):
        _train(ddp, opt, it)
        assert _steps(opt) == [float(it + 1)] * len(params)
    final_params, final_states = uninterrupted["final"]
    for p, want in zip(model.parameters(), final_params):
        assert torch.equal(p, want)
    for got, want in zip(_inner_state(opt), final_states):
        for key in want:
            assert torch.equal(got[key], want[key]), key


def test_reloading_the_live_state_keeps_steps_per_param(gloo_world, make_tiny):
    """The upstream ``load_state_dict`` puts one shared ``step`` into every param's state."""
    model, ddp, opt = _build(make_tiny, seed=2)
    _train(ddp, opt, 0)
    _train(ddp, opt, 1)
    opt.load_state_dict(opt.state_dict())
    assert _steps(opt) == [2.0] * 4
    _train(ddp, opt, 2)
    assert _steps(opt) == [3.0] * 4

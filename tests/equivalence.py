"""Parallel runs checked against the one-process reference (``train``'s outputs)."""

import pytest
import torch

# Steps of the one-process references that several modules' equivalence tests share
# (the ``one_process_reference`` fixture, tests/conftest.py).
REFERENCE_STEPS = 3


def merge_stages(ranks, key, step=None) -> dict:
    """One name -> tensor dict from the pipeline stages' pieces of ``key`` (at ``step``)."""
    merged = {}
    for out in ranks:
        part = out[key] if step is None else out[key][step]
        assert not set(part) & set(merged), "a parameter lives on two stages"
        merged.update(part)
    return merged


def assert_equal_runs(stages, ref, steps, holding=None, params_atol=1e-5):
    """The stages' run (TP rank 0 of each) equals ``ref``: the last stage's losses, the
    gradients of the first and last step and the final parameters, to fp32 tolerance
    (``params_atol``: Adam turns a last-bit difference of a near-zero gradient into one of
    up to its learning rate); some parameter's name starts with ``holding``."""
    for it in range(1, steps + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for what, step, atol in (("grads", 1, 1e-6), ("grads", steps, 1e-6),
                             ("params", None, params_atol)):
        ours, theirs = merge_stages(stages, what, step), (ref[what] if step is None
                                                          else ref[what][step])
        assert ours.keys() == theirs.keys()
        if holding is not None:
            assert any(n.startswith(holding) for n in theirs), holding
        for name, value in theirs.items():
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")


def assert_norm_counted_once(ranks, ref, steps):
    """Every rank's squares of its gradient-norm terms, module by module, sum to the one
    process's at the first and last step: each parameter counted once (not its TP
    duplicates, shared copies or encoder replicas)."""
    for step in (1, steps):
        squares = {}
        for out in ranks:
            for top, value in out["norm_squares"][step].items():
                squares[top] = squares.get(top, 0.0) + value
        assert squares == pytest.approx(ref["norm_squares"][step], rel=1e-4), step

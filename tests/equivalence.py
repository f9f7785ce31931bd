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


def assert_same_moe_losses(ranks, ref, steps, scalars=None, where=()):
    """The load-balancing loss (reduced over the ranks) and the tokens each expert got
    (padding left out: the same whatever the split) on every rank of ``ranks`` equal
    ``ref``'s at each step, and in TensorBoard's ``scalars`` (tag -> step -> value) if
    given; ``where`` names the run in a failure."""
    for it in range(1, steps + 1):
        want = ref["moe_losses"][it]
        for rank in ranks:
            got = rank["moe_losses"][it]
            assert got["load_balancing_loss"] == pytest.approx(
                want["load_balancing_loss"], rel=1e-5), (*where, it)
            assert got["tokens_per_expert"] == want["tokens_per_expert"], (*where, it)
        if scalars is not None:
            assert scalars["load_balancing_loss"][it] == pytest.approx(
                want["load_balancing_loss"], rel=1e-5)
            for e, count in enumerate(want["tokens_per_expert"]):
                assert scalars[f"moe/tokens_per_expert_{e}"][it] == count


def assert_same_answers(last_stages, ref, prompts, atol=0.0):
    """The last evaluation's greedy decoding (``train_workers.record_answers``) of the LLM
    replicas' last stages ``last_stages`` equals ``ref``'s (one run's last stage, its only
    evaluation): the same answers to its ``prompts`` prompts and the same logits at every
    decoding step, each prompt on whichever replica (a tiny model's answers may all be
    EOS: the logits tell whether each prompt's media reached the LLM; bit for bit unless
    ``atol``, for layouts that sum in another order), and the same accuracy."""
    ours = sorted(ids for out in last_stages for ids in out["observed"]["answers"][-1])
    theirs = ref["observed"]["answers"]
    assert len(theirs) == 1 and len(theirs[0]) == prompts
    assert ours == sorted(theirs[0])
    rows = [r for out in last_stages for r in out["observed"]["answer_logits"][-1]]
    theirs = ref["observed"]["answer_logits"][0]
    # interleaved 1F1B runs a batch padded with repeats of its last prompt to PP rows
    assert len(rows) >= len(theirs) >= prompts, (len(rows), len(theirs))
    for row in theirs:  # bit for bit: the same LLM forward on the same features (a tiny
        # model's DeepStack features move its logits by 1e-7 only)
        assert any(torch.allclose(r, row, rtol=0.0, atol=atol) if atol else torch.equal(r, row)
                   for r in rows), "a decoding step's logits differ"
    assert last_stages[-1]["val_accuracy"] == ref["val_accuracy"]

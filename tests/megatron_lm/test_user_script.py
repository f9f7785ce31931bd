"""A user's own Megatron-LM script (``user_pretrain_vlm.py``: Megatron-LM's
``pretrain_vlm.py`` shape, a GPT with Megatron-LM's defaults: LayerNorm, GELU, biases,
learned absolute positions), on gloo CPU ranks without any CPU flag: from one
checkpoint, PP=2 with ``--encoder-schedule bubble`` (through ``use_encoder_schedule``),
PP=2 with Megatron-Core's schedule, CP=2 and DP=2 give the same losses and gradient norms;
CP=2 without ``--calculate-per-token-loss`` the same as with it (every digits answer is one
token: the micro-batches' token means are the global batch's); the log names the encoder
schedule and reports the answer accuracy. Each step the docs give, left out, stops both
ranks before any work with one line from rank 0, status 2. One launch of two ranks."""

import pytest
from balanced_runs import small_digits
from dist_harness import run_distributed
from megatron_lm_runs import run_steps, user_flags

pytestmark = [pytest.mark.processes, pytest.mark.slow]

PER_TOKEN = ["--calculate-per-token-loss"]
PP2 = ["--pipeline-model-parallel-size", "2"]
RUNS = {
    "dp2": PER_TOKEN,  # Megatron-Core's schedule, the reference
    "pp2_bubble": [*PER_TOKEN, *PP2, "--encoder-schedule", "bubble", "--eval-interval", "4",
                   "--eval-iters", "1", "--eval-max-new-tokens", "2"],
    "pp2_megatron": [*PER_TOKEN, *PP2, "--encoder-schedule", "megatron"],
    # --pipeline-partition auto with the layout its error prints
    "pp2_auto": [*PER_TOKEN, *PP2, "--pipeline-partition", "auto",
                 "--pipeline-model-parallel-layout", "Et*2|L"],
    "cp2": [*PER_TOKEN, "--context-parallel-size", "2"],
    "cp2_mean": ["--context-parallel-size", "2"],  # Megatron-Core's mean of means
    "dp2_mean": [],
}
FAILS = {  # main()'s keywords, flags -> what the error names
    "no_hook": ({"hook": False}, [*PP2, "--encoder-schedule", "bubble"],
                "use_encoder_schedule"),
    "spec": ({"wrap_spec": False}, ["--context-parallel-size", "2"], "language_layer_spec"),
    # the plan's layout (the LLM's two layers on the first stage, the output layer on the
    # second) is not Megatron-Core's even split: the error prints the flags that give it
    "partition": ({}, [*PP2, "--pipeline-partition", "auto"],
                  "--pipeline-model-parallel-layout 'Et*2|L'"),
}


@pytest.fixture(scope="module")
def runs(digits_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("user_script")
    data = ["--data-path", small_digits(digits_dir, str(root / "digits"), n=64)]
    start = str(root / "start")
    four = [*data, "--train-iters", "4", "--no-load-rng", *PER_TOKEN]
    # its initial state: one DP=2 iteration (Megatron-LM saves none before)
    steps = {"init": ("user", user_flags(*four, "--exit-interval", "1", "--save", start,
                                         "--save-interval", "1000"))}
    for name, flags in RUNS.items():
        steps[name] = ("user", user_flags(*data, "--train-iters", "4", "--no-load-rng",
                                          "--load", start, *flags))
    for name, (kwargs, flags, _) in FAILS.items():
        steps[name] = ("user_exits", user_flags(*data, "--train-iters", "4", *flags), kwargs)
    results = run_distributed(run_steps, 2, list(steps.values()))
    return {name: [rank[i] for rank in results] for i, name in enumerate(steps)}


def last_stage(result):
    return next(r for r in reversed(result) if r["losses"])


@pytest.mark.parametrize("name", ["pp2_bubble", "pp2_megatron", "pp2_auto", "cp2"])
def test_parallel_runs_equal_dp2(runs, name):
    got, want = last_stage(runs[name]), last_stage(runs["dp2"])
    for key in ("losses", "grad_norms"):
        assert list(got[key]) == [2, 3, 4], (key, got[key])
        for it in (2, 3, 4):
            assert got[key][it] == pytest.approx(want[key][it], rel=1e-5, abs=1e-6), (key, it)


def test_cp2_without_per_token_loss_equals_with_it(runs):
    """Before the fix, 0.5x the gradient norm at every iteration (the answer token on one
    CP rank, Megatron-Core's mean of the two ranks' own means)."""
    for name in ("cp2_mean", "dp2_mean"):
        got, want = last_stage(runs[name]), last_stage(runs["cp2"])
        for key in ("losses", "grad_norms"):
            for it in (2, 3, 4):
                assert got[key][it] == pytest.approx(want[key][it], rel=1e-5, abs=1e-6), \
                    (name, key, it)


def test_log_names_the_schedule_and_reports_answer_accuracy(runs):
    first = runs["pp2_bubble"][0]["log"]
    assert any(line.startswith("> encoder schedule bubble") for line in first), first
    last = runs["pp2_bubble"][-1]["log"]  # the last stage prints validation
    assert any("val answer accuracy:" in line and "(4 samples)" in line for line in last), last
    assert any("encoder schedule megatron" in line for line in runs["dp2"][0]["log"])


@pytest.mark.parametrize("name", sorted(FAILS))
def test_a_step_left_out_is_one_error_line(runs, name):
    words = FAILS[name][2]
    for rank, out in enumerate(runs[name]):
        assert out["returncode"] == 2, (name, rank, out)
        errors = [line for line in out["stderr"].splitlines() if "error" in line]
        assert "Traceback" not in out["stderr"], out["stderr"][-3000:]
        if rank == 0:
            assert len(errors) == 1 and words in errors[0], errors
        else:
            assert errors == [], errors

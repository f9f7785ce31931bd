"""The flag sets people run, scaled down to two ranks, through Megatron-LM's own
``pretrain`` (``examples/megatron_lm/pretrain_vlm.py``) and through
``examples/pretrain_mllm.py``: each equals the plain run (DP=2, which the rest of the
suite shows equal to one process) from the same initial checkpoint, losses and gradient
norms, or is refused up front by name. The list is what Megatron-Bridge's VLM recipes
set (Qwen3-VL / Qwen3.5-VL: the distributed optimizer with ``overlap_grad_reduce`` and
``overlap_param_gather``, TP=2 with sequence parallelism off for dense and on for MoE,
``cross_entropy_loss_fusion``, full uniform recompute of one layer, gradient accumulation
fusion) plus Megatron-LM's ``--defer-embedding-wgrad-compute``, selective recompute,
VPP and the package's bubble and coarse schedules. One launch of two ranks
(``tests/flag_matrix_runs.py``); what only a GPU can check: docs/gpu.md ("The flag
matrix on a GPU")."""

import pytest
from balanced_runs import small_digits
from dist_harness import run_distributed
from flag_matrix_runs import run_rows
from megatron_lm_runs import LLAMA, megatron_lm_flags, ours_flags

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ITERS = ["--train-iters", "3"]
TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]
OVERLAP = ["--use-distributed-optimizer", "--overlap-grad-reduce"]
FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1"]
SELECTIVE = ["--recompute-granularity", "selective"]
DEFER = ["--defer-embedding-wgrad-compute"]
# Megatron-LM's VPP flag (its --virtual-pipeline-model-parallel-size is derived): 4 layers
VPP2 = [*PP2, "--num-layers-per-virtual-pipeline-stage", "1"]
MOE_MLM = ["--num-experts", "2", "--moe-router-topk", "2", "--moe-token-dispatcher-type",
           "alltoall", "--moe-ffn-hidden-size", "64"]
MOE_OURS = ["--num-layers", "3", "--num-experts", "4", "--moe-ffn-hidden-size", "32",
            "--moe-layer-freq", "[1,0,1]", "--moe-router-topk", "2",
            "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall"]
LOCAL_SP = [*TP2, "--sequence-parallel", "--transformer-impl", "local"]

# row -> (the reference row, relative tolerance). fp32 sums in another order (TP, the
# distributed optimizer's shards) differ by rounding that Adam's steps grow to ~1e-5.
EQUAL = {
    "mlm/distopt_overlap_param_gather": ("mlm/dp2", 2e-5),
    "mlm/tp2": ("mlm/dp2", 2e-5),
    # Megatron-Core's fused cross entropy hands back its logits' gradient in bf16
    # (fusions/fused_cross_entropy.py calculate_gradients): equal to bf16 rounding
    "mlm/tp2_cross_entropy_fusion": ("mlm/dp2", 1e-4),
    "mlm/recompute_selective": ("mlm/dp2", 1e-6),
    "mlm/recompute_full": ("mlm/dp2", 1e-6),
    "mlm/pp2_defer_megatron": ("mlm/dp2", 1e-5),
    "mlm/pp2_defer_bubble": ("mlm/dp2", 1e-5),
    "mlm/pp2_defer_coarse_overlap": ("mlm/dp2", 1e-5),
    "mlm/pp2_bubble_overlap": ("mlm/dp2", 1e-5),
    "mlm4/vpp2_megatron_overlap_param_gather": ("mlm4/dp2", 1e-5),
    "mlm4/vpp2_bubble_overlap_param_gather": ("mlm4/dp2", 1e-5),
    "ours/dp2": ("mlm/dp2", 1e-5),
    "ours/distopt_overlap": ("ours/dp2", 1e-5),
    "ours/tp2": ("ours/dp2", 2e-5),
    "ours/tp2_sp": ("ours/dp2", 2e-5),
    "ours/recompute_selective": ("ours/dp2", 1e-6),
    "ours/recompute_full": ("ours/dp2", 1e-6),
    "ours/pp2_bubble_overlap": ("ours/dp2", 1e-5),
    "ours/pp2_coarse_overlap": ("ours/dp2", 1e-5),
    "ours_moe/tp2_sp": ("ours_moe/dp2", 5e-5),
    "qwen3_5/tp2_sp": ("qwen3_5/dp2", 2e-5),
    "qwen3_5/tp2": ("qwen3_5/dp2", 2e-5),
}
# rows refused up front: the words of the one error
REFUSED = {
    "ours_moe/tp2": "--sequence-parallel",
    "mlm_moe/tp2": "--sequence-parallel",
}


@pytest.fixture(scope="module")
def rows(digits_dir, qwen3_5_data, tmp_path_factory):
    from qwen3_5_model import QWEN3_5_MODEL

    root = tmp_path_factory.mktemp("flag_matrix")
    data = ["--data-path", small_digits(digits_dir, str(root / "digits"), n=64)]
    init, init4, q_init, moe_ours = (str(root / n) for n in (
        "init", "init4", "q_init", "moe_ours"))
    start = ["--load", init, "--no-load-optim", "--no-load-rng", *ITERS]
    start4 = ["--load", init4, "--no-load-optim", "--no-load-rng", *ITERS, "--num-layers", "4"]

    def mlm(*flags, fused=False, llm=LLAMA):
        argv = megatron_lm_flags(*data, *flags, llm=llm)
        # gradient accumulation fusion on (over the stand-in kernel, "wgrad"): Megatron-Core
        # defers the embedding wgrad only with it
        return ("megatron_lm", [f for f in argv if not fused
                                or f != "--no-gradient-accumulation-fusion"],
                {"wgrad"} if fused else set())

    steps = {
        "init": ("ours", ours_flags(*data, "--train-iters", "0", "--save", init), set()),
        "init4": ("ours", ours_flags(*data, "--num-layers", "4", "--train-iters", "0",
                                     "--save", init4), set()),
        "mlm/dp2": mlm(*start),
        "mlm/distopt_overlap_param_gather": mlm(*start, *OVERLAP, "--overlap-param-gather",
                                                "--ddp-bucket-size", "10000"),
        "mlm/tp2": mlm(*start, *TP2),
        "mlm/tp2_cross_entropy_fusion": mlm(*start, *TP2, "--cross-entropy-loss-fusion"),
        "mlm/recompute_selective": mlm(*start, *SELECTIVE),
        "mlm/recompute_full": mlm(*start, *FULL),
        "mlm/pp2_defer_megatron": mlm(*start, *PP2, *DEFER, fused=True),
        "mlm/pp2_defer_bubble": mlm(*start, *PP2, *DEFER, "--encoder-schedule", "bubble",
                                    fused=True),
        "mlm/pp2_defer_coarse_overlap": mlm(*start, *PP2, *DEFER, "--encoder-schedule",
                                            "coarse", "--overlap-grad-reduce", fused=True),
        "mlm/pp2_bubble_overlap": mlm(*start, *PP2, *OVERLAP, "--overlap-param-gather",
                                      "--encoder-schedule", "bubble"),
        "mlm4/dp2": mlm(*start4),
        "mlm4/vpp2_megatron_overlap_param_gather": mlm(*start4, *VPP2, *OVERLAP,
                                                       "--overlap-param-gather"),
        "mlm4/vpp2_bubble_overlap_param_gather": mlm(*start4, *VPP2, *OVERLAP,
                                                     "--overlap-param-gather",
                                                     "--encoder-schedule", "bubble"),
        # Megatron-Core's MoE layer refuses TP without SP in training (moe_layer.py
        # forward); the package's check_args says so before any process group exists
        "mlm_moe/tp2": mlm(*start, *TP2, llm=[*LLAMA, *MOE_MLM]),
        "ours/dp2": ("ours", ours_flags(*data, *start), set()),
        "ours/distopt_overlap": ("ours", ours_flags(*data, *start, *OVERLAP), set()),
        "ours/tp2": ("ours", ours_flags(*data, *start, *TP2), set()),
        "ours/tp2_sp": ("ours", ours_flags(*data, *start, *TP2, "--sequence-parallel"),
                        set()),
        "ours/recompute_selective": ("ours", ours_flags(*data, *start, *SELECTIVE), set()),
        "ours/recompute_full": ("ours", ours_flags(*data, *start, *FULL), set()),
        "ours/pp2_bubble_overlap": ("ours", ours_flags(*data, *start, *PP2, *OVERLAP,
                                                      "--encoder-schedule", "bubble"), set()),
        "ours/pp2_coarse_overlap": ("ours", ours_flags(*data, *start, *PP2, *OVERLAP,
                                                      "--encoder-schedule", "coarse"), set()),
        "ours_moe/init": ("ours", ours_flags(*data, *MOE_OURS, "--train-iters", "0",
                                             "--save", moe_ours), set()),
    }
    moe_start = ["--load", moe_ours, "--no-load-optim", "--no-load-rng", *ITERS]
    steps["ours_moe/dp2"] = ("ours", ours_flags(*data, *MOE_OURS, *moe_start), set())
    steps["ours_moe/tp2"] = ("ours", ours_flags(*data, *MOE_OURS, *moe_start, *TP2), set())
    # with the experts over the TP ranks (EP=2, expert TP 1), as Megatron-Bridge's MoE
    # recipes run them beside SP
    steps["ours_moe/tp2_sp"] = ("ours", ours_flags(
        *data, *MOE_OURS, *moe_start, *LOCAL_SP, "--expert-model-parallel-size", "2",
        "--expert-tensor-parallel-size", "1"), set())
    qwen = QWEN3_5_MODEL + ["--data-path", qwen3_5_data, "--micro-batch-size", "2",
                            "--global-batch-size", "4", "--make-vocab-size-divisible-by", "64",
                            "--transformer-impl", "local"]
    q_start = ["--load", q_init, "--no-load-optim", "--no-load-rng", *ITERS, "--eval-iters", "0"]
    steps["qwen3_5/init"] = ("ours", qwen + ["--train-iters", "0", "--save", q_init], set())
    steps["qwen3_5/dp2"] = ("ours", qwen + q_start, set())
    steps["qwen3_5/tp2_sp"] = ("ours", qwen + q_start + LOCAL_SP, set())
    steps["qwen3_5/tp2"] = ("ours", qwen + q_start + TP2, set())
    results = run_distributed(run_rows, 2, list(steps.values()))
    return {name: [rank[i] for rank in results] for i, name in enumerate(steps)}


@pytest.fixture(scope="module")
def qwen3_5_data(tmp_path_factory):
    from qwen_vl_data import write_qwen_vl_data

    return write_qwen_vl_data(str(tmp_path_factory.mktemp("qwen3_5")), unit=32)


def _reported(row):
    """The rank that reports the loss (both, or the last pipeline stage)."""
    for rank in row:
        assert rank["error"] is None, rank["error"] + "\n" + rank["output"]
    return next(r for r in reversed(row) if r["losses"])


def _assert_same(got, want, rel):
    for key in ("losses", "grad_norms"):
        assert got[key].keys() == want[key].keys(), (key, got[key], want[key])
        for it, value in want[key].items():
            assert got[key][it] == pytest.approx(value, rel=rel, abs=1e-6), (key, it)


@pytest.mark.parametrize("name", sorted(EQUAL))
def test_row_equals_the_plain_run(rows, name):
    reference, rel = EQUAL[name]
    _assert_same(_reported(rows[name]), _reported(rows[reference]), rel)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_row_refused_up_front_by_name(rows, name):
    for rank in rows[name]:
        assert rank["error"] == "SystemExit: 2", rank["error"]
        assert REFUSED[name] in rank["output"], rank["output"]


def test_deferred_embedding_wgrad_drained_every_iteration(rows):
    """The output layer's weight gradient is computed (the rows above equal the plain run)
    and its buffers are empty after every iteration on the last stage (before the
    executor drained them, they grew by the micro-batches of each iteration)."""
    for name in ("mlm/pp2_defer_megatron", "mlm/pp2_defer_bubble",
                 "mlm/pp2_defer_coarse_overlap"):
        last = rows[name][-1]
        assert last["buffers"] == {1: 0, 2: 0, 3: 0}, (name, last["buffers"])


def test_aligned_param_gathers_dispatched_by_the_schedule(rows):
    """VPP=2 with --overlap-param-gather: Megatron-LM's param_sync_func runs once per model
    chunk and training step after the first (Megatron-LM sets it from the second step),
    under the bubble schedule as under Megatron-Core's interleaved one."""
    for rank in (0, 1):
        ours = rows["mlm4/vpp2_bubble_overlap_param_gather"][rank]["param_syncs"]
        theirs = rows["mlm4/vpp2_megatron_overlap_param_gather"][rank]["param_syncs"]
        assert ours == theirs == 2 * 2, (rank, ours, theirs)


@pytest.mark.parametrize("flag", ["--overlap-param-gather", "--defer-embedding-wgrad-compute",
                                  "--cross-entropy-loss-fusion"])
def test_pretrain_mllm_refuses_megatron_lm_only_flags_by_name(flag, capsys):
    """examples/pretrain_mllm.py's parser has none of these (Megatron-LM's pretrain runs
    them, above): one line naming the flag, exit status 2."""
    from megatron_mm.training.cli.arguments import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(ours_flags(flag))
    assert e.value.code == 2
    assert flag in capsys.readouterr().err

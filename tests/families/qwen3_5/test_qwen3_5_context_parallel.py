"""Qwen3.5 under context parallelism (the Gated DeltaNet layers head-parallel over the CP
ranks, natural order around their scan; the full-attention layers on the package's
balanced token split, unequal counts per rank) equals one process from the same initial
checkpoint over three steps, losses and gradients: CP=2; CP=2 on packed rows (THD
cu_seqlens, the GDN state restarting per sample); Qwen3.5-MoE at CP=2 x EP=2; CP=2 x TP=2
with sequence parallelism; and, on a hybrid LLM behind a fixed-length ViT, media attending
bidirectionally at CP=2 and at CP=2 x PP=2 with the ViT in the LLM's bubbles. And the GDN
layer alone against one rank (tests/gdn_cp_check.py). Three launches: the references (one
rank), the 2-rank layouts and the layer check, the 4-rank layouts."""

import pytest
import torch
from dist_harness import run_distributed
from equivalence import assert_equal_runs
from gdn_cp_check import assert_gdn_cp_errors, check_gdn_cp, train_runs
from qwen3_5_model import QWEN3_5_MODEL
from qwen_vl_data import write_qwen_vl_data
from train_workers import TINY_MODEL

pytestmark = pytest.mark.processes

STEPS = 3
GRADS = (1, STEPS)
# 4 key and 8 value heads of 16: TP 2 x CP 2 splits them
HEADS = ["--linear-num-key-heads", "4", "--linear-num-value-heads", "8"]
SIZES = (64, 64, 128, 128, 8, 8)  # in_proj's q k v z b a rows (conv1d: the first three)
CP2 = ["--context-parallel-size", "2", "--context-parallel-block", "8"]
BALANCE = ["--data-balance", "isf-sorted", "--seq-length", "160"]
MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "24", "--moe-router-topk", "2",
       "--moe-shared-expert-intermediate-size", "40", "--moe-shared-expert-gate",
       "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall",
       "--adam-eps", "1e-6"]
# The tiny CLIP-style model (16 tokens per image: media items of known length) with a
# hybrid LLM: GDN layer 0, full attention layer 1
HYBRID = [*TINY_MODEL, "--experimental-attention-variant", "gated_delta_net",
          "--linear-attention-freq", "2", "--linear-key-head-dim", "16",
          "--linear-value-head-dim", "16", *HEADS, "--media-attention", "bidirectional"]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--transformer-impl",
          "local"]
PP2_BUBBLE = ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"]


def _batch(data):
    return ["--data-path", data, "--micro-batch-size", "2", "--global-batch-size", "4",
            "--make-vocab-size-divisible-by", "64"]


@pytest.fixture(scope="module")
def runs(digits_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_5_cp")
    (root / "data").mkdir()
    qwen = [*QWEN3_5_MODEL, *HEADS, *_batch(write_qwen_vl_data(str(root / "data"), unit=32))]
    models = {"qwen": qwen, "moe": [*qwen, *MOE], "hybrid": [*HYBRID, *_batch(digits_dir)]}
    train = {}
    refs = []
    for name, argv in models.items():
        init = str(root / f"init_{name}")
        refs.append((argv + ["--train-iters", "0", "--save", init], ()))
        train[name] = argv + ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    refs += [(train["qwen"], GRADS), (train["qwen"] + BALANCE, GRADS),
             (train["moe"], GRADS), (train["hybrid"], GRADS)]
    one = run_distributed(train_runs, 1, refs)[0][3:]
    two = run_distributed(train_runs, 2, [
        (train["qwen"] + CP2, GRADS), (train["qwen"] + BALANCE + CP2, GRADS),
        (train["moe"] + CP2 + ["--expert-model-parallel-size", "2"], GRADS),
        (train["hybrid"] + CP2, GRADS)], check_gdn_cp)
    four = run_distributed(train_runs, 4, [(train["qwen"] + CP2 + TP2_SP, GRADS),
                                           (train["hybrid"] + CP2 + PP2_BUBBLE, GRADS)])
    ref = dict(zip(("qwen", "packed", "moe", "hybrid"), one))
    return {"cp2": ([r[0] for r in two], ref["qwen"]),
            "cp2-packed": ([r[1] for r in two], ref["packed"]),
            "cp2-ep2-moe": ([r[2] for r in two], ref["moe"]),
            "cp2-bidirectional": ([r[3] for r in two], ref["hybrid"]),
            "cp2-tp2-sp": ([r[0] for r in four], ref["qwen"]),
            "cp2-pp2-bubble-bidirectional": ([r[1] for r in four], ref["hybrid"]),
            "layer": [r[4] for r in two]}


def test_gdn_layer_equals_one_rank(runs):
    """The GDN layer alone at CP=2 (tests/gdn_cp_check.py): local and TE specs, the
    planner's unequal split, packed samples, a micro-batch every rank holds whole."""
    assert_gdn_cp_errors(runs["layer"])


def _tp_canonical(name: str, value, tp: int = 2):
    """A GDN tensor gathered from ``tp`` ranks (each its heads' [q k v z b a] rows of
    in_proj, [q k v] channels of conv1d) in the one process's order."""
    if name.endswith("self_attention.in_proj.weight"):
        sizes = SIZES
    elif name.endswith("self_attention.conv1d.weight"):
        sizes = SIZES[:3]
    else:
        return value
    ranks = [r.split([s // tp for s in sizes]) for r in value.chunk(tp)]
    return torch.cat([ranks[r][k] for k in range(len(sizes)) for r in range(tp)])


@pytest.mark.parametrize("layout", ["cp2", "cp2-packed", "cp2-ep2-moe", "cp2-bidirectional",
                                    "cp2-tp2-sp", "cp2-pp2-bubble-bidirectional"])
def test_context_parallel_equals_one_process(runs, layout):
    ranks, ref = runs[layout]
    stages = ranks[::2] if "pp2" in layout else ranks[:1]
    if "tp2" in layout:
        for out in stages:
            for key in ("params",):
                out[key] = {n: _tp_canonical(n, v) for n, v in out[key].items()}
            out["grads"] = {s: {n: _tp_canonical(n, v) for n, v in g.items()}
                            for s, g in out["grads"].items()}
    # params: Adam turns last-bit gradient differences of TP's sums into up to 1e-5
    assert_equal_runs(stages, ref, STEPS, params_atol=5e-5)
    gdn = [n for n in ref["grads"][1] if n.endswith("self_attention.A_log")]
    assert gdn and all(ref["grads"][1][n].abs().sum() > 0 for n in gdn)

"""The recipes: the demos are the Makefile's former flag strings exactly; each real starting
point validates for its world size on CPU (no model built) and the planner accepts it
(``tools/plan.py --recipe NAME``); ``--recipe`` takes a recipe's values as defaults that the
flags given (and a checkpoint's architecture) override."""

import contextlib
import importlib.util
import io
import os
import shlex

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.data.digits_tokenizer import MODEL as DIGITS_TOKENIZER
from megatron_mm.recipes import RECIPES, WORLD_SIZES, get_recipe, with_fields
from megatron_mm.training.cli.arguments import build_parser, read_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = [name for name in RECIPES if not name.startswith("demo")]

# The Makefile's flag strings before the recipes (DEMO_RECIPE expanded); the Qwen3.5 demo's
# since given its own tokenizer and 2,500 iterations.
_SCHEDULE = ("--lr 1e-3 --min-lr 1e-5 --lr-decay-style cosine --lr-warmup-iters 10 "
             "--weight-decay 0.01 --clip-grad 1.0 --seed 1234 --log-interval 50 "
             "--eval-iters 10 --micro-batch-size 16 --global-batch-size 32 ")
_DEMO = ("--num-layers 2 --hidden-size 128 --num-attention-heads 4 --group-query-attention "
         "--num-query-groups 2 --seq-length 64 --vision-hidden-size 64 --vision-num-layers 2 "
         "--vision-num-attention-heads 4 --img-h 16 --img-w 16 --patch-dim 8 "
         "--disable-vision-class-token --train-iters 600 --eval-interval 200 "
         "--save-interval 600 ")
_QWEN3_VISION = ("--vision-model-type qwen3_vl --vision-hidden-size 64 --vision-num-layers 2 "
                 "--vision-num-attention-heads 4 --patch-dim 16 "
                 "--vision-num-position-embeddings 64 --min-pixels 1024 --max-pixels 9216 "
                 "--video-min-pixels 2048 --video-max-pixels 16384 ")
MAKEFILE_FLAGS = {
    "demo": _DEMO + _SCHEDULE + "--save runs/demo/checkpoints",
    "demo_audio": _DEMO + _SCHEDULE + "--save runs/demo-audio/checkpoints "
    "--audio-model-type whisper --audio-hidden-size 64 --audio-num-layers 2 "
    "--audio-num-attention-heads 4 --audio-num-mel-bins 80 --audio-max-source-positions 64 "
    "--audio-pool-stride 4",
    "demo_qwen": "--num-layers 2 --hidden-size 128 --num-attention-heads 8 "
    "--group-query-attention --num-query-groups 4 --seq-length 64 "
    "--position-embedding-type mrope --mrope-section 2 3 3 --vision-model-type qwen2_5_vl "
    "--vision-hidden-size 64 --vision-num-layers 2 --vision-num-attention-heads 4 "
    "--patch-dim 14 --min-pixels 784 --max-pixels 7056 --video-min-pixels 784 "
    "--video-max-pixels 3136 --train-iters 3000 --eval-interval 1000 "
    "--save runs/demo-qwen/checkpoints --save-interval 3000 " + _SCHEDULE,
    "demo_qwen3": "--num-layers 2 --hidden-size 128 --num-attention-heads 8 "
    "--group-query-attention --num-query-groups 4 --qk-layernorm --seq-length 80 "
    "--position-embedding-type mrope --mrope-section 2 3 3 --mrope-interleaved "
    + _QWEN3_VISION + "--vision-deepstack-visual-indexes 0 --train-iters 4000 "
    "--eval-interval 1000 --save runs/demo-qwen3/checkpoints --save-interval 4000 "
    + _SCHEDULE,
    "demo_qwen35": "--num-layers 4 --hidden-size 128 --num-attention-heads 8 "
    "--group-query-attention --num-query-groups 4 --kv-channels 32 --qk-layernorm "
    "--seq-length 80 --position-embedding-type mrope --mrope-section 2 1 1 "
    "--mrope-interleaved --rotary-percent 0.25 --attention-output-gate --apply-layernorm-1p "
    "--experimental-attention-variant gated_delta_net --linear-attention-freq 2 "
    "--linear-key-head-dim 16 --linear-value-head-dim 16 --linear-num-key-heads 4 "
    "--linear-num-value-heads 8 " + _QWEN3_VISION + "--vision-deepstack-visual-indexes "
    f"--tokenizer-type SentencePiece --tokenizer-model {DIGITS_TOKENIZER} --train-iters 2500 "
    "--eval-interval 500 --save runs/demo-qwen35/checkpoints "
    "--save-interval 2500 " + _SCHEDULE,
}


@pytest.mark.parametrize("name", sorted(MAKEFILE_FLAGS))
def test_demo_recipe_is_the_makefile_flags(name):
    """Every flag of the recipe equals what the former flag string parsed to, and
    ``--recipe NAME`` reads back the same validated run."""
    parsed = vars(build_parser().parse_args(shlex.split(MAKEFILE_FLAGS[name])))
    values = get_recipe(name).flags()
    assert {k: values[k] for k in parsed} == parsed
    by_recipe = read_args(["--recipe", name], world_size=2)
    by_flags = read_args(shlex.split(MAKEFILE_FLAGS[name]), world_size=2)
    assert vars(by_recipe) == vars(by_flags)


def test_makefile_demos_run_their_recipes():
    from makefile_flags import makefile_flags

    for var, name in (("DEMO_FLAGS", "demo"), ("DEMO_AUDIO_FLAGS", "demo_audio"),
                      ("DEMO_QWEN_FLAGS", "demo_qwen"), ("DEMO_QWEN3_FLAGS", "demo_qwen3"),
                      ("DEMO_QWEN35_FLAGS", "demo_qwen35")):
        assert makefile_flags(var, expand_recipe=False) == ["--recipe", name]
        assert read_args(makefile_flags(var), world_size=2).model_config == read_args(
            ["--recipe", name], world_size=2).model_config


def load_plan_tool():
    spec = importlib.util.spec_from_file_location("plan_tool", os.path.join(ROOT, "tools",
                                                                           "plan.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_real_recipes_validate_and_plan(tmp_path):
    """Each real recipe, its placeholder data path set, validates for its world size (no
    model built); ``tools/plan.py --recipe NAME`` prints a plan for its layout."""
    for split in ("train", "valid"):
        (tmp_path / f"{split}.jsonl").write_text("")
    plan = load_plan_tool()
    for name in REAL:
        config = get_recipe(name)
        assert config.data.data_path == ["DATA"] and config.checkpoint.load == "CKPT"
        config = with_fields(config, "data", data_path=[str(tmp_path)])
        checked = config.validated(world_size=WORLD_SIZES[name])
        p = checked.parallel
        assert (p.tensor_model_parallel_size * p.pipeline_model_parallel_size
                * p.context_parallel_size * p.data_parallel_size) == WORLD_SIZES[name]
        assert checked.training.bf16 and p.use_distributed_optimizer
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert plan.main(["--recipe", name]) == 0, name
        text = out.getvalue()
        tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
        assert f"TP {tp}" in text and f"PP {pp} x VPP 1" in text, text
        assert "| auto |" in text and "infeasible" not in text, text
    moe = get_recipe("qwen3_vl_30b_a3b_ep")
    assert moe.moe.num_experts == 128 and moe.parallel.expert_model_parallel_size == 8


def test_flags_given_win_and_a_bad_name_lists_the_recipes():
    args = read_args(["--recipe", "demo", "--train-iters", "70", "--num-layers", "3"],
                     world_size=2)
    assert (args.train_iters, args.num_layers, args.hidden_size) == (70, 3, 128)
    args = read_args(["--num-layers", "3", "--recipe=demo_qwen"], world_size=2)
    assert (args.num_layers, args.vision_model_type) == (3, "qwen2_5_vl")
    with pytest.raises(ConfigError, match="no such recipe; known: demo, demo_audio"):
        read_args(["--recipe", "nope"])


def test_recipe_values_are_defaults_under_load(tmp_path, monkeypatch):
    """With --load, the checkpoint's architecture replaces a recipe's (defaults, not flags
    given); only a flag written on the command line must agree with it."""
    from megatron_mm.training.checkpoint import checkpointing

    monkeypatch.setattr(checkpointing, "saved_args",
                        lambda checkpoint: {"num_layers": 3, "hidden_size": 128})
    args = read_args(["--recipe", "demo", "--load", str(tmp_path)], world_size=2)
    assert args.num_layers == 3  # the recipe's 2 gives way
    with pytest.raises(ConfigError, match="--num-layers 2 disagrees with the checkpoint"):
        read_args(["--recipe", "demo", "--load", str(tmp_path), "--num-layers", "2"],
                  world_size=2)

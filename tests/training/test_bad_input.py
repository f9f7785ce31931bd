"""Bad flags and bad data stop with a clear message that names what to fix."""

import pytest
from bad_input_runs import conversation, good_records, run_entry, run_script, write_data
from plans import tokenizer

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import parse_args
from megatron_mm.training.cli.user_errors import exit_with_user_error


@pytest.mark.parametrize("argv, world, message", [
    (["--tensor-model-parallel-size", "2", "--hidden-size", "96", "--num-attention-heads", "3"],
     2, "--num-attention-heads (3) is not divisible by --tensor-model-parallel-size (2)"),
    (["--tensor-model-parallel-size", "2", "--vision-hidden-size", "48",
      "--vision-num-attention-heads", "3"],
     2, "--vision-num-attention-heads (3) is not divisible by --tensor-model-parallel-size"),
    (["--tensor-model-parallel-size", "2", "--ffn-hidden-size", "129"],
     2, "--ffn-hidden-size (129) is not divisible by --tensor-model-parallel-size (2)"),
    (["--hidden-size", "100", "--num-attention-heads", "3"],
     1, "--hidden-size (100) must be divisible by --num-attention-heads (3)"),
    (["--tensor-model-parallel-size", "2"], 3,
     "world size 3 is not divisible by --tensor-model-parallel-size (2)"),
    (["--micro-batch-size", "4", "--global-batch-size", "6"], 1,
     "--global-batch-size (6) must be a multiple of --micro-batch-size (4)"),
    (["--log-validation-samples", "2", "--eval-max-new-tokens", "0"], 1,
     "--log-validation-samples shows greedy answers: it needs --eval-max-new-tokens above 0"),
    (["--img-h", "30", "--patch-dim", "7"], 1, "--img-h (30) must be divisible by --patch-dim"),
    # pipeline partitions (the default model's chain: embedding, ViT embed, 2 ViT layers,
    # projector, 2 LLM layers, output = 8 layers)
    (["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "5",
      "--micro-batch-size", "1", "--global-batch-size", "2"],
     2, "the chain has 8 layers, fewer than PP x VPP = 10 pipeline stages"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,4"], 2,
     "--pipeline-partition counts sum to 7, but the chain has 8 layers (1 llm_embed + "
     "1 vision_embed + 2 vision_layer + 1 projector + 2 llm_layer + 1 llm_head)"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,3,2"], 2,
     "--pipeline-partition lists 3 stages, but --pipeline-model-parallel-size (2) = 2"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-partition", "fast"], 2,
     "--pipeline-partition must be auto, uniform, balanced, search or a comma-separated list"),
    (["--pipeline-model-parallel-size", "4"], 4,
     "uniform partition: 2 LLM layers cannot fill PP x VPP = 4 stages"),
    (["--pipeline-model-parallel-size", "2", "--memory-limit-gb", "0.001"], 2,
     "uniform partition [6, 2]: pipeline stage 0 needs"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-partition", "auto",
      "--memory-limit-gb", "0.001"], 2, "no split of the 8-layer chain into PP x VPP = 2"),
    # partition search and recomputation
    (["--pipeline-model-parallel-size", "2", "--pipeline-partition", "search",
      "--pipeline-search-radius", "-1"], 2, "--pipeline-search-radius must be >= 0"),
    (["--pipeline-search-candidates", "0"], 1, "--pipeline-search-candidates must be >= 1"),
    (["--pipeline-search-iters", "0"], 1, "--pipeline-search-iters must be >= 1"),
    (["--recompute-granularity", "full"], 1,
     "--recompute-granularity full needs --recompute-method (uniform or block) and "
     "--recompute-num-layers"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"], 1,
     "--recompute-granularity selective takes no --recompute-method"),
    (["--recompute-method", "block"], 1,
     "--recompute-method and --recompute-num-layers need --recompute-granularity full"),
    (["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "0"], 1, "--recompute-num-layers must be >= 1"),
    (["--recompute-memory-budget", "0"], 1, "--recompute-memory-budget must be positive"),
    (["--recompute-memory-budget", "1", "--recompute-method", "uniform"], 1,
     "--recompute-memory-budget chooses --recompute-num-layers per stage"),
    (["--recompute-memory-budget", "0.0001"], 1,
     "--recompute-memory-budget 0.0001 GB: pipeline rank 0 needs"),
    # context parallelism
    (["--context-parallel-size", "0"], 1, "--context-parallel-size must be >= 1"),
    (["--context-parallel-size", "2", "--context-parallel-block", "0"], 2,
     "--context-parallel-block must be >= 1"),
    (["--context-parallel-size", "2", "--context-parallel-block-overhead", "-1"], 2,
     "--context-parallel-block-overhead must be >= 0"),
    (["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"], 2,
     "world size 2 is not divisible by --tensor-model-parallel-size (2) x "
     "--pipeline-model-parallel-size (1) x --context-parallel-size (2)"),
    # M-RoPE (default LLM: 4 heads of 32 channels, 16 rotary frequencies)
    (["--position-embedding-type", "mrope"], 1,
     "--position-embedding-type mrope needs --mrope-section T H W"),
    (["--position-embedding-type", "mrope", "--mrope-section", "4", "4", "4"], 1,
     "--mrope-section 4 4 4 sums to 12; it must equal --kv-channels / 2 (16"),
    (["--position-embedding-type", "mrope", "--mrope-section", "8", "8"], 1,
     "--mrope-section takes three non-negative ints (temporal, height, width), got [8, 8]"),
    (["--mrope-section", "4", "6", "6"], 1,
     "--mrope-section needs --position-embedding-type mrope"),
    # RoPE scaling: Llama 3.x's on 1-D RoPE, YaRN's flags with yarn
    (["--use-rope-scaling", "--position-embedding-type", "yarn"], 1,
     "--use-rope-scaling needs --position-embedding-type rope, got yarn"),
    (["--use-rope-scaling", "--rope-scaling-factor", "0"], 1,
     "--rope-scaling-factor must be > 0, got 0.0"),
    (["--yarn-beta-fast", "16"], 1, "--yarn-beta-fast needs --position-embedding-type yarn"),
    (["--no-yarn-correction-range-round-to-int"], 1,
     "--no-yarn-correction-range-round-to-int needs --position-embedding-type yarn"),
    (["--position-embedding-type", "yarn", "--rotary-scaling-factor", "-2"], 1,
     "--rotary-scaling-factor must be > 0, got -2.0"),
    # Transformer Engine is never installed on the CPU test machine
    (["--transformer-impl", "transformer_engine"], 1,
     "--transformer-impl transformer_engine needs Transformer Engine, which is not installed"),
    # the encoder as its own pipeline
    (["--pipeline-model-parallel-size", "4", "--num-layers", "4", "--encoder-schedule",
      "bubble", "--encoder-pipeline-model-parallel-size", "3"], 4,
     "--encoder-pipeline-model-parallel-size (3) must divide --pipeline-model-parallel-size"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "coarse",
      "--encoder-pieces", "2"], 2, "4 pieces of encoder 'vision' but it has 2 layers"),
    (["--tensor-model-parallel-size", "2", "--encoder-schedule", "bubble",
      "--encoder-tensor-model-parallel-size", "3"], 2,
     "--encoder-tensor-model-parallel-size (3) must divide --tensor-model-parallel-size (2)"),
    (["--tensor-model-parallel-size", "4", "--encoder-schedule", "bubble",
      "--encoder-tensor-model-parallel-size", "2", "--vision-hidden-size", "48",
      "--vision-num-attention-heads", "3"], 4,
     "--vision-num-attention-heads (3) is not divisible by "
     "--encoder-tensor-model-parallel-size (2)"),
    (["--tensor-model-parallel-size", "2", "--encoder-tensor-model-parallel-size", "1"], 2,
     "--encoder-tensor-model-parallel-size needs --encoder-schedule coarse or bubble"),
    (["--pipeline-model-parallel-size", "2", "--encoder-pipeline-model-parallel-size", "2"],
     2, "--encoder-pipeline-model-parallel-size needs --encoder-schedule coarse or bubble"),
    # the encoder interleaved over its own pipeline
    (["--pipeline-model-parallel-size", "2", "--encoder-virtual-pipeline-model-parallel-size",
      "2"], 2, "--encoder-virtual-pipeline-model-parallel-size needs --encoder-schedule "
               "coarse or bubble"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble",
      "--encoder-pipeline-model-parallel-size", "1",
      "--encoder-virtual-pipeline-model-parallel-size", "2"], 2,
     "--encoder-virtual-pipeline-model-parallel-size 2 interleaves the encoder over its "
     "pipeline stages: it needs --encoder-pipeline-model-parallel-size of at least 2 (it is 1)"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble",
      "--encoder-virtual-pipeline-model-parallel-size", "0"], 2,
     "--encoder-virtual-pipeline-model-parallel-size must be at least 1 (got 0)"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble",
      "--encoder-virtual-pipeline-model-parallel-size", "2"], 2,
     "4 pieces of encoder 'vision' but it has 2 layers: lower --encoder-pieces, "
     "--encoder-pipeline-model-parallel-size or --encoder-virtual-pipeline-model-parallel-size"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "separate",
      "--encoder-virtual-pipeline-model-parallel-size", "2"], 3,
     "--encoder-virtual-pipeline-model-parallel-size does not apply to --encoder-schedule "
     "separate"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble",
      "--tensor-model-parallel-size", "2", "--encoder-tensor-model-parallel-size", "1",
      "--context-parallel-size", "2"], 8, "--encoder-schedule bubble does not combine with "
                                          "--encoder-tensor-model-parallel-size below"),
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "auto",
      "--context-parallel-size", "2", "--vision-dp-when-cp"], 4,
     "--vision-dp-when-cp needs --encoder-schedule megatron"),
    # the encoders on ranks of their own: the rest must hold whole LLM model replicas
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "separate"], 4,
     "the world's 4 ranks less the 1 encoder ranks (--encoder-tensor-model-parallel-size 1 "
     "x --encoder-data-parallel-size 1) leave 3 for the LLM, not a multiple of "
     "--tensor-model-parallel-size x --pipeline-model-parallel-size x "
     "--context-parallel-size (2)"),
    (["--encoder-schedule", "separate", "--encoder-data-parallel-size", "2"], 2,
     "leave 0 for the LLM"),
    (["--encoder-data-parallel-size", "2"], 2,
     "--encoder-data-parallel-size needs --encoder-schedule separate"),
    # each encoder on replicas of its own
    (["--pipeline-model-parallel-size", "2", "--encoder-schedule", "separate",
      "--audio-model-type", "whisper", "--vision-encoder-data-parallel-size", "2"], 4,
     "(--vision-encoder-data-parallel-size 2 + --audio-encoder-data-parallel-size 1)) leave "
     "1 for the LLM, not a multiple of --tensor-model-parallel-size x "
     "--pipeline-model-parallel-size x --context-parallel-size (2)"),
    (["--audio-encoder-data-parallel-size", "1", "--audio-model-type", "whisper"], 2,
     "--audio-encoder-data-parallel-size needs --encoder-schedule separate"),
    (["--encoder-schedule", "separate", "--audio-encoder-data-parallel-size", "1"], 3,
     "--audio-encoder-data-parallel-size: the model has no audio encoder (--audio-model-type "
     "none)"),
    (["--encoder-schedule", "separate", "--audio-model-type", "whisper",
      "--encoder-data-parallel-size", "1", "--vision-encoder-data-parallel-size", "1"], 3,
     "--vision-encoder-data-parallel-size puts each encoder on replicas of its own, "
     "--encoder-data-parallel-size all encoders on shared ones: pass one of them"),
    (["--eval-max-new-tokens", "-1"], 1,
     "--eval-max-new-tokens must not be negative (0: no answer accuracy)"),
])
def test_bad_flags_name_the_flag(capsys, argv, world, message):
    with pytest.raises(SystemExit) as exit_info:
        validate_and_plan(argv, world)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err  # one line, not argparse's usage dump


def test_a_bad_flag_is_reported_by_rank_0_only(capsys, monkeypatch):
    for rank, printed in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        for argv in (["--hidden-size", "100", "--num-attention-heads", "3"], ["--bogus"]):
            with pytest.raises(SystemExit):
                parse_args(argv, world_size=2)
            err = capsys.readouterr().err
            assert ("error:" in err) == printed, (rank, argv, err)
            assert "usage:" not in err


def validate_and_plan(argv, world):
    """What a run checks before any process group: the flags, then the plan (made once,
    on the model with the tokenizer's vocabulary)."""
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import model_config_for
    from megatron_mm.training.planning.training_plan import plan_pipeline

    args = parse_args(argv, world_size=world)
    try:
        config = RunConfig.from_flags(args)
        plan_pipeline(config, model_config_for(config, tokenizer()))
    except ConfigError as e:  # as the script reports it: once, without a traceback
        exit_with_user_error(e)


@pytest.mark.processes
def test_placeholder_mismatch_names_the_record(tmp_path):
    data = write_data(tmp_path, [
        conversation("ok-1", "<image>\nWhat digit?", ["a.png"]),
        conversation("bad-2", "<image> and <image>?", ["a.png"]),
    ] + good_records(6))
    from PIL import Image

    Image.new("L", (8, 8), 128).save(tmp_path / "a.png")  # ok-1 reads before bad-2
    out = run_entry("--data-path", data)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "record 'bad-2'" in out.stderr and "line 2" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


@pytest.mark.processes
def test_missing_image_file_names_path_and_record(tmp_path):
    data = write_data(tmp_path, [conversation("r1", "<image>\nWhat?", ["nope/missing.png"])]
                       + good_records(7))
    out = run_entry("--data-path", data)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "missing.png" in out.stderr and "record 'r1'" in out.stderr, out.stderr[-2000:]


@pytest.mark.processes
def test_load_without_a_checkpoint(tmp_path):
    """The script itself in a fresh interpreter (the other runs here: its entry on a forked
    rank): exit status 2, the message, no traceback."""
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_script("--load", str(empty))
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"--load {empty}: no checkpoint found" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_mrope_flags_come_from_the_checkpoint(monkeypatch):
    """--mrope-section (a list on the command line, a tuple once taken from a checkpoint)
    agrees with the saved value when equal, and is refused when not."""
    import megatron_mm.training.checkpoint.checkpointing as checkpointing
    from megatron_mm.training.cli.arguments import (apply_checkpoint_args, build_parser,
                                                given_flags)

    monkeypatch.setattr(checkpointing, "saved_args", lambda args: {
        "position_embedding_type": "mrope", "mrope_section": [4, 6, 6]})
    for argv in (["--load", "ckpt"], ["--load", "ckpt", "--mrope-section", "4", "6", "6"]):
        args = build_parser().parse_args(argv)
        apply_checkpoint_args(args, given_flags(argv))
        assert (args.position_embedding_type, tuple(args.mrope_section)) == ("mrope", (4, 6, 6))
    argv = ["--load", "ckpt", "--mrope-section", "4", "4", "8"]
    with pytest.raises(ConfigError, match="--mrope-section .* disagrees with the checkpoint"):
        apply_checkpoint_args(build_parser().parse_args(argv), given_flags(argv))


@pytest.mark.processes
def test_flex_attention_training_on_cpu_names_the_flag():
    """torch runs no FlexAttention backward on CPU: training there on it is refused in one
    line, before any process group; forward-only runs (--train-iters 0) may use it."""
    out = run_entry("--attention-backend", "flex", "--media-attention", "bidirectional")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--attention-backend flex cannot train here: no CUDA device" in out.stderr, \
        out.stderr[-2000:]
    assert "Traceback" not in out.stderr

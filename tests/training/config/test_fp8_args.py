"""FP8 flags: Megatron-LM's names and defaults, and every bad combination stops up front
with the flag to change. This CPU environment has no Transformer Engine (a test in the TE
work checks that), so FP8 without --fp8-emulation must say so, never run BF16 silently."""

import pytest

from megatron_mm.training.cli.arguments import parse_args

EMU = ["--fp8-format", "hybrid", "--fp8-emulation"]
# 16 x 16 images, patch 4: 16 patches (+ CLIP's class token inside the ViT = 17).
ALIGNED = ["--img-h", "16", "--img-w", "16", "--patch-dim", "4",
           "--disable-vision-class-token", "--vision-model-type", "siglip"]


@pytest.mark.parametrize("argv, message", [
    # FP8 without TE is an error that says so; --fp8-* without --fp8-format too.
    (["--fp8-format", "hybrid"], "--fp8-format needs Transformer Engine, which is not "
                                 "installed (Megatron-Core would silently train without FP8)"),
    (["--fp8-format", "e4m3", "--transformer-impl", "local"],
     "--fp8-format runs in Transformer Engine layers: pass --transformer-impl "
     "transformer_engine, or --fp8-emulation"),
    (["--fp8-recipe", "tensorwise"], "--fp8-recipe needs --fp8-format"),
    (["--fp8-margin", "1"], "--fp8-margin needs --fp8-format"),
    (["--fp8-amax-history-len", "16"], "--fp8-amax-history-len needs --fp8-format"),
    (["--fp8-amax-compute-algo", "max"], "--fp8-amax-compute-algo needs --fp8-format"),
    (["--fp8-param-gather"], "--fp8-param-gather needs --fp8-format"),
    (["--first-last-layers-bf16"], "--first-last-layers-bf16 needs --fp8-format"),
    (["--num-layers-at-start-in-bf16", "2"], "--num-layers-at-start-in-bf16 needs --fp8-format"),
    (["--num-layers-at-end-in-bf16", "0"], "--num-layers-at-end-in-bf16 needs --fp8-format"),
    (["--fp8-modules", "vision"], "--fp8-modules needs --fp8-format"),
    (["--tp-only-amax-red"], "--tp-only-amax-red needs --fp8-format"),
    (["--fp8-emulation"], "--fp8-emulation needs --fp8-format"),
    # the emulation
    (EMU + ["--transformer-impl", "transformer_engine"],
     "--fp8-emulation emulates FP8 in the local layers: pass --transformer-impl local"),
    (EMU + ["--fp8-recipe", "mxfp8"], "--fp8-emulation emulates --fp8-recipe delayed and "
                                      "tensorwise (per-tensor scales), not mxfp8"),
    (EMU + ["--fp8-recipe", "blockwise"], "not blockwise"),
    (EMU + ["--fp8-param-gather", "--use-distributed-optimizer"],
     "--fp8-param-gather keeps weights in Transformer Engine's FP8 tensors"),
    (EMU + ["--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "1"],
     "--fp8-emulation with --recompute-granularity full: Megatron-Core recomputes FP8 "
     "blocks through Transformer Engine's checkpoint"),
    # tensorwise too: Megatron-Core's checkpointed_forward calls te_checkpoint for FP8
    (EMU + ["--fp8-recipe", "tensorwise", "--recompute-granularity", "full",
            "--recompute-method", "uniform", "--recompute-num-layers", "1"],
     "--fp8-emulation with --recompute-granularity full"),
    # Megatron-Core's rules, up front
    (EMU + ["--fp8-amax-history-len", "0"], "--fp8-amax-history-len must be >= 1"),
    (EMU + ["--first-last-layers-bf16"],
     "--first-last-layers-bf16 does not work with --fp8-recipe delayed"),
    (EMU + ["--num-layers-at-start-in-bf16", "2"],
     "--num-layers-at-start-in-bf16 needs --first-last-layers-bf16"),
    (EMU + ["--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
            "--num-layers-at-end-in-bf16", "3"],
     "--num-layers-at-end-in-bf16 (3) must be between 0 and the llm layers per pipeline "
     "stage (2)"),
    (EMU + ["--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
            "--num-layers-at-start-in-bf16", "-1"],
     "--num-layers-at-start-in-bf16 (-1) must be between 0"),
    # modules and their token alignment
    (EMU + ["--fp8-modules", "llm,speech"],
     "--fp8-modules 'llm,speech': unknown module(s) speech; this model has llm, vision, "
     "vision-projector (or all)"),
    (EMU + ["--fp8-modules", "vision"],
     "--fp8-modules vision: 17 tokens per item (patches + 1 class token (--img-h, --img-w, "
     "--patch-dim)) is not a multiple of the FP8 alignment 16"),
    (EMU + ["--fp8-modules", "vision-projector", "--img-h", "28", "--img-w", "28"],
     "--fp8-modules vision-projector: 17 tokens per item"),
    (EMU + ["--fp8-modules", "vision-projector", "--fp8-recipe", "tensorwise"] + ALIGNED[:7],
     None),  # 16 tokens per image: fine at 16
    (EMU + ["--seq-length", "72"], "--seq-length (72) must be a multiple of 16"),
    # under sequence parallelism each TP rank's shard of the sequence is what FP8 GEMMs
    # take: the LLM's S / TP, the audio projector's pooled frames / TP (32 / 4 = 8 rows an
    # item), while the ViT pads patches and class token to TP x 16 (17 -> 32: 16 a rank)
    (EMU + ["--tensor-model-parallel-size", "4", "--sequence-parallel",
            "--seq-length", "96"], "--seq-length (96) must be a multiple of 64"),
    (EMU + ["--fp8-modules", "audio-projector", "--tensor-model-parallel-size", "4",
            "--sequence-parallel", "--audio-model-type", "whisper", "--audio-hidden-size",
            "64", "--audio-num-attention-heads", "4", "--audio-max-source-positions", "32",
            "--audio-pool-stride", "1", "--seq-length", "128"],
     "--fp8-modules audio-projector: 8 tokens per item"),
    # our CP split: each CP rank holds whole blocks, its FP8 GEMMs' rows
    (EMU + ["--context-parallel-size", "2", "--context-parallel-block", "8"],
     "--context-parallel-block (8) must be a multiple of 16 with an FP8 LLM"),
    (EMU + ["--context-parallel-size", "2", "--context-parallel-block", "16",
            "--seq-length", "64"], None),
    (EMU + ["--fp8-modules", "vision,vision-projector", "--tensor-model-parallel-size", "2",
            "--sequence-parallel", "--vision-num-attention-heads", "2"] + ALIGNED[:7], None),
    # FP8 GEMM input widths (per TP shard)
    (EMU + ["--hidden-size", "72"], "--fp8-modules llm: --hidden-size (72) must be a "
                                    "multiple of 16 (FP8 GEMM input width"),
    (EMU + ["--ffn-hidden-size", "200"], "--ffn-hidden-size / TP (200) must be a multiple"),
    (EMU + ["--tensor-model-parallel-size", "2", "--ffn-hidden-size", "456"],
     "--ffn-hidden-size / TP (228) must be a multiple of 16"),
    (EMU + ["--fp8-modules", "vision-projector", "--vision-hidden-size", "40",
            "--vision-num-attention-heads", "4"] + ALIGNED[:7],
     "--fp8-modules vision-projector: --vision-hidden-size (40) must be a multiple of 16"),
])
def test_fp8_flag_errors(capsys, argv, message):
    world = 1
    for flag in ("--tensor-model-parallel-size", "--context-parallel-size"):
        world *= int(argv[argv.index(flag) + 1]) if flag in argv else 1
    if message is None:
        parse_args(argv, world_size=world)
        return
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=world)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_megatron_rules_come_before_the_te_check(capsys):
    # Megatron-LM's own rules are reported whether TE is installed or not.
    with pytest.raises(SystemExit):
        parse_args(["--fp8-format", "hybrid", "--fp8-param-gather"], world_size=1)
    assert "--fp8-param-gather needs --use-distributed-optimizer" in capsys.readouterr().err


def test_fp8_llm_sequences_are_padded_by_the_collator():
    from megatron_mm.data.processing import Sample, collate
    from megatron_mm.training.config.fp8_args import llm_sequence_multiple
    from megatron_mm.training.cli.arguments import parse_run_config

    def multiple(argv):
        config = parse_run_config(argv, world_size=1)
        return llm_sequence_multiple(config.fp8_settings, config.parallel)

    assert multiple(EMU) == 16
    assert multiple([]) == 1
    assert multiple(EMU + ["--fp8-modules", "vision-projector"] + ALIGNED[:7]) == 1
    import torch

    sample = Sample(tokens=torch.arange(5), labels=torch.arange(5), loss_mask=torch.ones(5),
                    media={}, prompt_len=2, answer="a", record_id="r")
    batch = collate([sample], pad_id=0, pad_to_multiple_of=16)
    assert batch["tokens"].shape == (1, 16) and batch["loss_mask"][0, 5:].sum() == 0


def test_fp8_with_encoder_replicas_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(EMU + ["--fp8-modules", "vision-projector", "--tensor-model-parallel-size",
                          "2", "--pipeline-model-parallel-size", "2", "--encoder-schedule",
                          "coarse", "--encoder-tensor-model-parallel-size", "1"] + ALIGNED[:7],
                   world_size=4)
    assert ("--encoder-tensor-model-parallel-size (1) below --tensor-model-parallel-size"
            in capsys.readouterr().err)


@pytest.mark.parametrize("extra, refused", [
    (["--encoder-data-parallel-size", "2"], True),
    (["--encoder-data-parallel-size", "2", "--fp8-recipe", "tensorwise"], False),
    (["--encoder-data-parallel-size", "2", "--tp-only-amax-red"], False),
    # an FP8 projector with one encoder replica of TP 1 below the LLM's TP 2: no encoder
    # replicas inside the LLM's TP group here (the colocated schedules' refusal)
    (["--tensor-model-parallel-size", "2", "--fp8-modules", "vision-projector"], False)])
def test_fp8_encoder_on_separate_replicas(capsys, extra, refused):
    """--encoder-schedule separate: a delayed-scaling FP8 encoder's amaxes are reduced over
    its replicas, whose separately ordered actions would not pair the reductions up."""
    argv = EMU + ["--fp8-modules", "vision,vision-projector,llm", "--encoder-schedule",
                  "separate", "--eval-max-new-tokens", "0"] + ALIGNED + extra
    if not refused:
        parse_args(argv, world_size=3)
        return
    with pytest.raises(SystemExit):
        parse_args(argv, world_size=3)
    assert ("--fp8-modules vision (--fp8-recipe delayed) with --encoder-data-parallel-size 2 "
            "under --encoder-schedule separate" in capsys.readouterr().err)


@pytest.mark.parametrize("extra, lockstep", [
    ([], 2),  # delayed: the LLM's and projector's amaxes reduced over both LLM replicas
    (["--fp8-recipe", "tensorwise"], 1), (["--tp-only-amax-red"], 1),
    (["--fp8-modules", "vision"], 1)])  # only the encoder FP8, on its own rank
def test_separate_llm_replicas_walk_together_under_fp8_delayed_scaling(extra, lockstep):
    """1 encoder rank and 2 LLM replicas: the program keeps the replicas' actions in step
    when collectives inside them span the replicas (``separate_world.llm_lockstep_replicas``)."""
    from megatron_mm.training.cli.arguments import parse_run_config
    from megatron_mm.training.assembly.separate_world import llm_lockstep_replicas

    config = parse_run_config(EMU + ["--fp8-modules", "llm,vision-projector",
                                     "--encoder-schedule", "separate",
                                     "--eval-max-new-tokens", "0"] + ALIGNED + extra,
                              world_size=3)
    assert llm_lockstep_replicas(config) == lockstep


def test_megatron_defaults_and_settings():
    args = parse_args(EMU + ["--fp8-modules", "all", "--fp8-recipe", "tensorwise",
                             "--fp8-margin", "1", "--first-last-layers-bf16",
                             "--tp-only-amax-red"] + ALIGNED,
                      world_size=1)
    s = args.fp8_settings
    assert (s.fp8_format, s.recipe, s.margin, s.amax_history_len, s.amax_compute_algo) == (
        "hybrid", "tensorwise", 1, 1, "most_recent")
    assert s.modules == ("llm", "vision", "vision-projector") and s.emulation
    assert args.transformer_impl == "local"
    assert "EMULATION" in s.describe() and "not Transformer Engine" in s.describe()
    fields = s.transformer_config_fields()
    assert fields["fp8"] == "hybrid" and fields["tp_only_amax_red"] is True
    assert parse_args([], world_size=1).fp8_settings is None


def _qwen3_5_default_gdn():
    """The tiny Qwen3.5's flags with the --linear-* sizes left at their defaults (Qwen3.5's:
    16 key heads, 32 value heads of 128: in_proj 12352 rows)."""
    from qwen3_5_model import QWEN3_5_MODEL

    argv, skip = [], False
    for arg in QWEN3_5_MODEL:
        if skip:
            skip = False
        elif arg.startswith("--linear-") and arg.endswith(("-dim", "-heads")):
            skip = True
        else:
            argv.append(arg)
    return argv + ["--hidden-size", "256", "--num-attention-heads", "8",
                   "--num-query-groups", "4", "--ffn-hidden-size", "512", "--seq-length", "128",
                   "--vision-hidden-size", "64", "--vision-num-attention-heads", "4"]


@pytest.mark.parametrize("argv, world, message", [
    # the GDN in_proj: 12352 rows pass whole, 3088 per rank at TP=4 are not MXFP8's 32s
    (_qwen3_5_default_gdn() + EMU + ["--fp8-recipe", "mxfp8", "--tensor-model-parallel-size",
                                     "4"], 4,
     "--fp8-modules llm: each rank's Gated DeltaNet in_proj weight shard has 12352 / 4 "
     "(--tensor-model-parallel-size) = 3088 rows, not a multiple of 32"),
    (_qwen3_5_default_gdn() + EMU + ["--tensor-model-parallel-size", "4"], 4, None),
    # per-tensor: linear_qkv with GQA, (16 + 2 x 2) x 2 / 2 = 20 rows, not a multiple of 8
    (EMU + ["--num-attention-heads", "16", "--group-query-attention", "--num-query-groups",
            "2", "--kv-channels", "2", "--tensor-model-parallel-size", "2"], 2,
     "each rank's linear_qkv weight shard has 40 / 2 (--tensor-model-parallel-size) = 20 "
     "rows, not a multiple of 8"),
])
def test_fp8_weight_shards_are_checked_per_tp_rank(capsys, argv, world, message):
    if message is None:
        parse_args(argv, world_size=world)
        return
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=world)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err

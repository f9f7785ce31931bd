"""Bad Qwen3.5 flags stop before any process starts, with one line naming the flag: GDN
heads that TP x CP cannot split, a layer pattern that does not give each of the model's
layers (and so each pipeline stage's) a kind, GDN heads that TP cannot split, the pattern
without the variant."""

import pytest
from qwen3_5_model import QWEN3_5_MODEL
from test_bad_input import validate_and_plan


def _without(argv, flag, values):
    i = argv.index(flag)
    return argv[:i] + argv[i + 1 + values:]


@pytest.mark.parametrize("argv, world, message", [
    # 2 key heads over TP 2 x CP 2
    (["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"], 4,
     "--context-parallel-size 2: the Gated DeltaNet layers split their heads over "
     "--tensor-model-parallel-size (2) x --context-parallel-size (2); "
     "--linear-num-key-heads (2) is not divisible by 4"),
    (["--pipeline-model-parallel-size", "2", "--linear-attention-freq", "[1,0,1]"], 2,
     "--linear-attention-freq as a list takes one 0/1 per layer (--num-layers 4), got "
     "[1, 0, 1]"),
    (["--tensor-model-parallel-size", "2", "--linear-num-key-heads", "1",
      "--linear-num-value-heads", "4"], 2,
     "--linear-num-key-heads (1) is not divisible by --tensor-model-parallel-size (2)"),
])
def test_bad_qwen3_5_flags_name_the_flag(capsys, argv, world, message):
    with pytest.raises(SystemExit) as exit_info:
        validate_and_plan(QWEN3_5_MODEL + argv, world)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err and "Traceback" not in err


def test_pattern_needs_the_variant(capsys):
    argv = _without(QWEN3_5_MODEL, "--experimental-attention-variant", 1)
    with pytest.raises(SystemExit):
        validate_and_plan(argv, 1)
    assert ("--linear-attention-freq needs --experimental-attention-variant gated_delta_net"
            in capsys.readouterr().err)


@pytest.mark.parametrize("extra, message", [
    # in_proj: 2 x (2 x 16 + 4 x 16 + 4) = 200, not a multiple of 16
    ([], "--fp8-modules llm: the Gated DeltaNet in_proj's output width 2 x (key heads x "
         "dim + value heads x dim + --linear-num-value-heads) = 200 must be a multiple of 16"),
    # in_proj 2 x (32 + 72 + 8) = 224 fits; out_proj's input 8 x 9 = 72 does not
    (["--linear-value-head-dim", "9", "--linear-num-value-heads", "8"],
     "--fp8-modules llm: --linear-value-head-dim x --linear-num-value-heads / TP (72) must "
     "be a multiple of 16"),
    (["--linear-num-value-heads", "8"], None),  # 2 x (32 + 128 + 8) = 336; 128
])
def test_fp8_shape_rules_of_the_gdn_layers(capsys, extra, message):
    from megatron_mm.training.cli.arguments import parse_args

    argv = QWEN3_5_MODEL + ["--fp8-format", "hybrid", "--fp8-emulation",
                            "--seq-length", "96"] + extra
    if message is None:
        parse_args(argv, world_size=1)
        return
    with pytest.raises(SystemExit):
        parse_args(argv, world_size=1)
    assert message in capsys.readouterr().err

"""Bad fine-tuning flags (per-module rates, LoRA) stop with one line naming the flag."""

import pytest

from megatron_mm.training.arguments import parse_args


@pytest.mark.parametrize("argv, message", [
    (["--vision-lr", "1e-4", "--freeze-ViT"],
     "--vision-lr sets the optimizer of the vision encoder, which has nothing to train: "
     "--freeze-ViT freezes it"),
    (["--projector-weight-decay", "0.1", "--freeze-projector"],
     "--projector-weight-decay sets the optimizer of the projectors, which has nothing to "
     "train: --freeze-projector freezes every projector"),
    (["--audio-lr", "1e-4"], "the model has no audio encoder (--audio-model-type)"),
    (["--vision-min-lr", "1e-5"], "--vision-min-lr needs --vision-lr"),
    (["--min-lr", "1e-4", "--vision-lr", "1e-5"],
     "--min-lr (0.0001) exceeds --vision-lr (1e-05); pass --vision-min-lr"),
    (["--projector-lr", "-1"], "--projector-lr must not be negative"),
])
def test_bad_flags_name_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=1)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err and err.count("\n") == 1

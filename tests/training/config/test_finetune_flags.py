"""Bad fine-tuning flags (per-module rates, LoRA) stop with one line naming the flag."""

import pytest

from megatron_mm.training.cli.arguments import parse_args


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
    (["--lora-rank", "0"], "--lora-rank must be >= 1"),
    (["--lora-rank", "8", "--lora-target-modules", "qkv"],
     "--lora-target-modules qkv: no projection 'qkv' (one of q_proj, k_proj, v_proj, o_proj, "
     "gate_proj, up_proj, down_proj, all-linear)"),
    (["--lora-rank", "8", "--lora-target-modules", "audio_model.q_proj"],
     "--lora-target-modules audio_model.*: the model has no audio encoder"),
    (["--lora-rank", "8", "--freeze-LM"],
     "--freeze-LM would freeze the LoRA adapters of language_model too: drop it"),
    (["--lora-rank", "8", "--num-experts", "4"],
     "--lora-target-modules down_proj, gate_proj, up_proj: LoRA on the experts of an MoE LLM "
     "is not supported"),
    # LoRA freezes the ViT's base itself; --freeze-ViT would freeze its adapters
    (["--lora-rank", "8", "--lora-target-modules", "vision_model.q_proj", "--freeze-ViT"],
     "--freeze-ViT would freeze the LoRA adapters of vision_model too"),
])
def test_bad_flags_name_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=1)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err and err.count("\n") == 1


def test_a_vit_with_adapters_takes_its_own_rate():
    args = parse_args(["--lora-rank", "8", "--lora-target-modules", "q_proj",
                       "vision_model.all-linear", "--vision-lr", "1e-5"], world_size=1)
    assert args.model_config.lora.modules() == {
        "language_model": ("q_proj",), "vision_model": (
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}

"""``add_args`` on Megatron-LM's own parser (the wheel's ``add_megatron_arguments``, with
``pretrain_vlm.py``'s extra flags): no clash, every shared flag means the same in both
(attribute, kind, value form, choices), and the package's run configuration reads back
from Megatron-LM's parsed arguments; a bad flag is one ConfigError naming it."""

import argparse

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.megatron_lm import arguments as mm_args
from megatron_mm.training.cli.arguments import build_parser

pytestmark = pytest.mark.slow  # imports Megatron-LM's training package


def megatron_lm_parser(vlm_flags: bool = False):
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    if vlm_flags:  # Megatron-LM's pretrain_vlm.py add_vlm_extra_args, as that script has them
        g = parser.add_argument_group("vision language model specific arguments")
        g.add_argument("--freeze-LM", action="store_true", default=False)
        g.add_argument("--freeze-ViT", action="store_true", default=False)
        g.add_argument("--disable-vision-class-token", action="store_true", default=False)
    return parser


BOOL = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)


def kind(action):
    return "bool" if isinstance(action, BOOL) else "value"


def test_add_args_adds_the_package_flags_megatron_lm_lacks():
    for vlm in (False, True):
        parser = megatron_lm_parser(vlm)
        before = set(parser._option_string_actions)
        mm_args.add_args(parser)  # argparse raises on any clashing option string
        added = set(parser._option_string_actions) - before
        ours = {o for a in build_parser()._actions for o in a.option_strings}
        assert added and added <= ours
        assert "--vision-model-type" in added and "--encoder-schedule" in added
        assert "--tensor-model-parallel-size" not in added
        assert ("--freeze-LM" in added) is not vlm  # pretrain_vlm.py's own flag is kept


def test_shared_flags_mean_the_same():
    theirs = megatron_lm_parser(vlm_flags=True)
    by_dest = {a.dest: a for a in theirs._actions}
    shared = mm_args.shared_flags(theirs)
    assert len(shared) > 100
    for ours in shared:
        dest = mm_args.ATTRIBUTES.get(ours.dest, ours.dest)
        other = next((theirs._option_string_actions[o] for o in ours.option_strings
                      if o in theirs._option_string_actions), by_dest.get(dest))
        flag = ours.option_strings[0]
        assert other.dest == dest, (flag, other.dest)
        assert kind(other) == kind(ours), flag
        if kind(ours) == "bool":
            continue
        convert = mm_args.CONVERSIONS.get(ours.dest, lambda v: v)
        if ours.dest not in mm_args.CONVERSIONS:
            assert other.nargs == ours.nargs, flag
        default = other.default if other.default is not None else ours.default
        if other.type not in (ours.type, None, str) and default is not None:
            # both parsers' types read the same text alike
            text = str(getattr(default, "name", default))
            assert convert(other.type(text)) == (ours.type or str)(text), flag
        if ours.choices and other.choices:  # (None: their parser takes any value)
            reachable = set()
            for choice in other.choices:
                try:
                    reachable.add(convert(choice))
                except ConfigError:
                    pass
            missing = set(ours.choices) - reachable
            assert missing <= set(mm_args.NOT_REACHABLE.get(ours.dest, ())), (flag, missing)


def test_run_config_from_megatron_lm_args():
    parser = mm_args.add_args(megatron_lm_parser(vlm_flags=True))
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "64", "--norm-epsilon", "1e-4", "--vision-num-layers", "3",
            "--cp-comm-type", "p2p", "--tensor-model-parallel-size", "2", "--freeze-ViT",
            "--attention-backend", "unfused", "--tokenizer-type", "SentencePieceTokenizer",
            "--transformer-impl", "local", "--train-iters", "5", "--lr", "1e-3",
            "--position-embedding-type", "rope"]
    args = parser.parse_args(argv)
    args.world_size, args.micro_batch_size, args.global_batch_size = 2, 1, 1
    config = mm_args.run_config_from_args(args)
    assert config.model.norm_epsilon == 1e-4  # Megatron-LM's layernorm_epsilon
    assert config.model.attention_backend == "unfused"
    assert config.parallel.cp_comm_type is None  # Megatron-LM's default: not TE's here
    assert config.model_config.encoders["vision"].num_layers == 3
    assert config.model.freeze_ViT and config.parallel.data_parallel_size == 1
    args.tokenizer_type = "NullTokenizer"
    with pytest.raises(ConfigError, match="--tokenizer-type NullTokenizer"):
        mm_args.run_config_from_args(args)
    args.tokenizer_type, args.cp_comm_type = "HuggingFaceTokenizer", ["a2a", "p2p"]
    with pytest.raises(ConfigError, match="--cp-comm-type takes one value"):
        mm_args.run_config_from_args(args)


def test_check_args_reports_one_line_and_exits(capsys, monkeypatch):
    parser = mm_args.add_args(megatron_lm_parser())
    args = parser.parse_args(["--num-layers", "2", "--hidden-size", "64",
                              "--num-attention-heads", "4", "--seq-length", "64",
                              "--transformer-impl", "local", "--train-iters", "5", "--lr", "1e-3",
                              "--position-embedding-type", "rope",
                              "--tokenizer-type", "HuggingFaceTokenizer"])
    args.world_size, args.micro_batch_size, args.global_batch_size = 1, 1, 1
    args.dataloader_type = "single"  # Megatron-LM's validate_args' default
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as stop:
            mm_args.check_args(args)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == (1 if rank == "0" else 0)  # once per job: rank 0
        assert ("--dataloader-type single" in err) is (rank == "0")
        assert "Traceback" not in err
    args.dataloader_type = "external"
    mm_args.check_args(args)  # valid: returns


def test_the_package_vpp_flag_reaches_megatron_lm():
    """``--virtual-pipeline-model-parallel-size`` (the package's flag) sets Megatron-LM's
    ``--num-virtual-stages-per-pipeline-rank``: Megatron-LM's ``validate_args`` derives
    its VPP from that (before: reset to None, the run trained without VPP)."""
    from megatron.training.arguments import validate_args

    parser = mm_args.add_args(megatron_lm_parser(vlm_flags=True))
    args = parser.parse_args([
        "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
        "--global-batch-size", "2",
        "--train-iters", "5", "--lr", "1e-3", "--transformer-impl", "local",
        "--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
        "--tokenizer-type", "HuggingFaceTokenizer"])
    assert args.num_virtual_stages_per_pipeline_rank == 2
    args.rank, args.world_size = 0, 2
    validate_args(args)
    assert args.virtual_pipeline_model_parallel_size == 2
    config = mm_args.run_config_from_args(args)
    assert config.parallel.virtual_pipeline_model_parallel_size == 2


def test_check_args_refuses_the_separate_placement(capsys, monkeypatch):
    parser = mm_args.add_args(megatron_lm_parser())
    args = parser.parse_args(["--num-layers", "2", "--hidden-size", "64",
                              "--num-attention-heads", "4", "--seq-length", "64",
                              "--transformer-impl", "local", "--train-iters", "5", "--lr", "1e-3",
                              "--position-embedding-type", "rope", "--dataloader-type",
                              "external", "--encoder-schedule", "separate",
                              "--tokenizer-type", "HuggingFaceTokenizer"])
    args.world_size, args.micro_batch_size, args.global_batch_size = 2, 1, 1
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as stop:
        mm_args.check_args(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--encoder-schedule separate" in err, err
    assert "examples/pretrain_mllm.py" in err, err

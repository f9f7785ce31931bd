"""Flags given as typed values (the converter's way in, without the command line) give the
command line's RunConfig, a value the flag cannot take names the flag, and the result is
validated as the command line's is."""

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import read_args
from megatron_mm.training.config.run_config import RunConfig
from megatron_mm.training.config.values import run_config_of


def test_values_give_the_command_lines_flags():
    argv = ["--num-layers", "3", "--rotary-base", "500000", "--group-query-attention",
            "--num-query-groups", "2", "--vision-model-type", "qwen2_5_vl",
            "--vision-fullatt-block-indexes", "0", "1", "--no-use-thumbnail"]
    values = {"num_layers": 3, "rotary_base": 500000, "group_query_attention": True,
              "num_query_groups": 2, "vision_model_type": "qwen2_5_vl",
              "vision_fullatt_block_indexes": (0, 1), "use_thumbnail": False}
    want = RunConfig.from_flags(read_args(argv, world_size=1))
    got = run_config_of(values).validated(world_size=1)
    assert got.flags() == want.flags() and got.model_config == want.model_config
    flags = got.flags()
    assert type(flags["rotary_base"]) is float and flags["vision_fullatt_block_indexes"] == [0, 1]


def test_no_values_give_the_parsers_defaults():
    assert (run_config_of({}).validated(world_size=1).flags()
            == RunConfig.from_flags(read_args([], world_size=1)).flags())


@pytest.mark.parametrize("values,message", [
    ({"num_layers": 2.5}, "--num-layers: expected int, got 2.5"),
    ({"num_layers": True}, "--num-layers: expected int, got True"),
    ({"vision_model_type": "nope"}, "--vision-model-type: invalid choice: 'nope'"),
    ({"group_query_attention": 1}, "--group-query-attention is on or off"),
    ({"mrope_section": 16}, "--mrope-section takes a list"),
    ({"num_layer": 2}, "no flag stores 'num_layer'"),
])
def test_a_value_the_flag_cannot_take_names_it(values, message):
    with pytest.raises(ConfigError, match=message):
        run_config_of(values)


def test_values_are_validated_as_the_command_line_is():
    with pytest.raises(ConfigError, match="--lr-warmup-iters"):
        run_config_of({"lr_warmup_iters": 500, "train_iters": 10}).validated(world_size=1)

"""Flags given as typed values (the converter's way in) validate into the same namespace as
the command line, and a value the flag cannot take names the flag."""

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import read_args
from megatron_mm.training.cli.flag_values import read_values


def test_values_give_the_command_lines_flags():
    argv = ["--num-layers", "3", "--rotary-base", "500000", "--group-query-attention",
            "--num-query-groups", "2", "--vision-model-type", "qwen2_5_vl",
            "--vision-fullatt-block-indexes", "0", "1", "--no-use-thumbnail"]
    values = {"num_layers": 3, "rotary_base": 500000, "group_query_attention": True,
              "num_query_groups": 2, "vision_model_type": "qwen2_5_vl",
              "vision_fullatt_block_indexes": (0, 1), "use_thumbnail": False}
    want, got = vars(read_args(argv, world_size=1)), vars(read_values(values, world_size=1))
    assert got == want
    assert type(got["rotary_base"]) is float and got["vision_fullatt_block_indexes"] == [0, 1]


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
        read_values(values, world_size=1)


def test_values_are_validated_as_the_command_line_is():
    with pytest.raises(ConfigError, match="--lr-warmup-iters"):
        read_values({"lr_warmup_iters": 500, "train_iters": 10}, world_size=1)

"""One place chooses the CP core attention: Megatron-Core's TE CP only for TE on CUDA, a
plain causal mask and the zigzag split; ours otherwise; --cp-comm-type is TE's alone."""

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.models.specs import (
    choose_cp_attention, get_layer_specs, transformer_engine_available)

TE = dict(transformer_impl="transformer_engine", te_importable=True, cuda=True,
          media_attention="causal", packed=False, assignment="zigzag")


def test_te_cp_where_it_computes_the_same_thing():
    choice = choose_cp_attention(4, **TE)
    assert choice.kind == "transformer_engine" and choice.cp_comm_type == "p2p"
    assert "TEDotProductAttention" in choice.reason
    assert choose_cp_attention(4, **TE, cp_comm_type="a2a").cp_comm_type == "a2a"
    assert choose_cp_attention(1, **TE).kind == "none"


@pytest.mark.parametrize("change, why", [
    (dict(transformer_impl="local"), "--transformer-impl local"),
    (dict(te_importable=False), "Transformer Engine is not importable"),
    (dict(cuda=False), "no CUDA device"),
    (dict(media_attention="bidirectional"), "--media-attention bidirectional"),
    (dict(packed=True), "packed sequences"),
    (dict(assignment="ours"), "--context-parallel-assignment ours"),
])
def test_ours_otherwise_and_the_log_says_why(change, why):
    choice = choose_cp_attention(4, **{**TE, **change})
    assert choice.kind == "ours" and why in choice.reason and choice.cp_comm_type is None
    # Asking for TE's communication where TE's CP cannot run names the flag and the reason.
    with pytest.raises(ConfigError, match=r"--cp-comm-type a2a .*" + why.split()[0]):
        choose_cp_attention(4, **{**TE, **change}, cp_comm_type="a2a")


def test_unwired_or_unknown_comm_types():
    with pytest.raises(ConfigError, match="--hierarchical-context-parallel-sizes"):
        choose_cp_attention(4, **TE, cp_comm_type="a2a+p2p")
    with pytest.raises(ConfigError, match="--cp-comm-type must be one of"):
        choose_cp_attention(4, **TE, cp_comm_type="ring")


def test_te_cp_specs_need_te_impl():
    with pytest.raises(ConfigError, match="--transformer-impl transformer_engine"):
        get_layer_specs("local", context_parallel=True, cp_attention="transformer_engine")


@pytest.mark.skipif(not transformer_engine_available(),
                    reason="Transformer Engine and a CUDA device are absent")
def test_te_cp_specs_take_te_core_attention():
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    specs = get_layer_specs("transformer_engine", context_parallel=True,
                            cp_attention="transformer_engine")
    core = specs.language_layer.submodules.self_attention.submodules.core_attention
    assert issubclass(core, TEDotProductAttention)


def test_flags_reach_the_choice_and_the_error_names_the_flag():
    from megatron_mm.training.assembly.build_settings import cp_attention_choice
    from megatron_mm.training.cli.arguments import parse_run_config

    config = parse_run_config(["--context-parallel-size", "2"], world_size=2)
    assert cp_attention_choice(config).kind == "ours"
    config = parse_run_config(["--context-parallel-size", "2", "--cp-comm-type", "p2p"],
                              world_size=2)
    with pytest.raises(ConfigError, match="--cp-comm-type p2p .*drop the flag"):
        cp_attention_choice(config)


def test_te_cp_config_only_for_te_cp():
    from megatron_mm.models.transformer_configs import BuildSettings, _te_context_parallel

    assert _te_context_parallel(BuildSettings(context_parallel_size=4)) == {}
    te = BuildSettings(context_parallel_size=4, cp_attention="transformer_engine",
                       cp_comm_type="a2a")
    assert _te_context_parallel(te) == dict(context_parallel_size=4, cp_comm_type="a2a")


def test_te_zigzag_layout_check():
    from megatron_mm.models.context_parallel import context_parallel_mask
    from megatron_mm.reproductions.mask_families import family_codes
    from megatron_mm.training.assembly.attention import check_te_zigzag

    codes = family_codes("causal", 64)[None]
    for rank in range(2):  # 8 blocks of 8 on 2 ranks: chunks r and 3 - r of 16 tokens
        cpm = context_parallel_mask(codes, 2, rank, "zigzag", 8, None, "cpu")
        check_te_zigzag(cpm, 64, 8)
    short = context_parallel_mask(codes[:, :56], 2, 0, "zigzag", 8, None, "cpu")
    with pytest.raises(ConfigError, match="multiple of 2 x --context-parallel-size"):
        check_te_zigzag(short, 56, 8)

"""``make demo-qwen35``'s flags (Makefile ``DEMO_QWEN35_FLAGS``) parse into the tiny Qwen3.5 the
doc describes: Qwen3-VL's tower without DeepStack, layers 0 and 2 Gated DeltaNet and 1 and 3
gated full attention with a quarter of each head rotated, zero-centred norms; with no
--data-path it trains on the Qwen3-VL demo's built-in digits."""

from makefile_flags import makefile_flags


def test_demo_flags_make_the_hybrid_model():
    from megatron_mm.families import builtin_data_for
    from megatron_mm.training.cli.arguments import parse_args

    args = parse_args(makefile_flags("DEMO_QWEN35_FLAGS"), world_size=2)
    lm = args.model_config.language
    assert lm.linear_attention_pattern() == (1, 0, 1, 0)
    assert lm.attention_output_gate and lm.apply_layernorm_1p and lm.rotary_percent == 0.25
    assert lm.mrope_interleaved and lm.mrope_section == (2, 1, 1)
    vision = args.model_config.encoders["vision"]
    assert vision.model_type == "qwen3_vl" and vision.deepstack_visual_indexes == ()
    assert builtin_data_for([vision]).name == "digits_qwen3"

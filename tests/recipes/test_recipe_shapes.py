"""A model recipe is the published architecture: the Qwen3.5-9B recipe's model fields equal
what the converter reads from transformers' Qwen3.5-9B-style configuration (its defaults:
32 layers of 4096, GDN 16 key / 32 value heads of 128, gated attention 16 heads in 4
groups of 256, MLP 12288, vocabulary 248,320, Qwen3-VL's tower) with the published rope
settings (base 1e7, a quarter rotated, interleaved M-RoPE 11 / 11 / 10, 262,144
positions). What differs is the recipe's run: LoRA, the frozen tower, the sequence length,
the processor's pixel bounds (its own file in a checkpoint, not the config)."""

import dataclasses

from megatron_mm.recipes import get_recipe

RUN_FIELDS = {"lora_rank", "lora_alpha", "freeze_ViT", "seq_length"}


def test_qwen3_5_9b_recipe_is_the_published_shape():
    import transformers

    from megatron_mm.families.qwen3_5.hf import model_flags
    from megatron_mm.training.config.values import run_config_of

    hf_config = transformers.Qwen3_5Config(
        text_config=dict(max_position_embeddings=262144, rope_parameters=dict(
            rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
            mrope_section=[11, 11, 10], mrope_interleaved=True)),
        vision_config=dict(out_hidden_size=4096))
    assert hf_config.text_config.num_hidden_layers == 32  # transformers' 9B-style defaults
    converted = dataclasses.asdict(run_config_of(model_flags(hf_config), {}).model)
    recipe = dataclasses.asdict(get_recipe("qwen3_5_9b_lora").model)
    pattern = converted.pop("linear_attention_freq")
    freq = recipe.pop("linear_attention_freq")
    assert pattern == [int((layer + 1) % freq != 0) for layer in range(32)]
    hf_groups, recipe_groups = converted.pop("families")["groups"], recipe.pop("families")["groups"]
    assert hf_groups[-1] == recipe_groups[-1]  # Qwen3-VL's: no DeepStack, a 48 x 48 table
    differ = {k for k in converted if converted[k] != recipe[k]}
    assert differ == RUN_FIELDS, {k: (converted[k], recipe[k]) for k in differ}

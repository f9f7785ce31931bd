"""Hugging Face RoPE scaling through the converter's flags onto Megatron-Core's rotary
embeddings (megatron_mm/hf/rope_scaling.py): the rotary frequencies and YaRN's cos / sin
scale of the built model equal transformers' own (``ROPE_INIT_FUNCTIONS``) for each way a
config states them. The logits of whole converted models: test_convert.py."""

import pytest
import torch

_TEXT = dict(vocab_size=250, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

_LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_YARN = {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 64}

CASES = {
    "llama3_1": ("llama", {**_LLAMA3, "factor": 8.0}),
    "llama3_2": ("llama", {**_LLAMA3, "factor": 32.0}),
    # Qwen2.5's long-context recipe: factor alone
    "yarn": ("qwen2", {**_YARN, "factor": 4.0}),
    # gpt-oss style: no rounding of the correction range, its own betas
    "yarn_no_truncate": ("qwen2", {**_YARN, "factor": 8.0, "beta_fast": 16.0,
                                   "beta_slow": 2.0, "truncate": False}),
    # DeepSeek style: attention factor from mscale over mscale_all_dim
    "yarn_mscale_ratio": ("qwen2", {**_YARN, "factor": 4.0, "mscale": 0.707,
                                    "mscale_all_dim": 1.0}),
    # mscale alone: Hugging Face ignores it (both or neither)
    "yarn_mscale_alone": ("qwen2", {**_YARN, "factor": 4.0, "mscale": 2.0}),
    "yarn_attention_factor": ("qwen2", {**_YARN, "factor": 4.0, "attention_factor": 1.5}),
    # no factor: the ratio of max_position_embeddings to the original context
    "yarn_factor_from_lengths": ("qwen2", {**_YARN, "factor": None}),
}


def _hf_config(kind, rope):
    from transformers import AutoConfig

    config = AutoConfig.for_model(kind, **_TEXT, rope_parameters=dict(rope))
    config.architectures = [_ARCH[kind]]
    return config


def _built(hf_config):
    """The model of the converted flags (a language model alone)."""
    from megatron_mm.hf.families import model_flags
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.training.config.values import run_config_of

    run = run_config_of(model_flags(hf_config)).validated(world_size=1)
    run.model_config.language.vocab_size = _TEXT["vocab_size"]
    return build_model(run.model_config, BuildSettings(), {})


@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_and_scale_equal_hugging_face(gloo_world, case):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind, rope = CASES[case]
    hf_config = _hf_config(kind, rope)
    want, want_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, "cpu")
    plain = 1.0 / rope["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16)
    assert not torch.allclose(want, plain)  # the scaling changes some frequency
    model = _built(hf_config)
    angles = model.rotary_embedding(torch.arange(2)[None])  # [positions, 1, 1, 2 x freqs]
    torch.testing.assert_close(angles[1, 0, 0, :8], want, rtol=1e-6, atol=0)
    # YaRN's cos / sin scale, applied by each layer's attention
    attention = model.language_model.decoder.layers[0].self_attention
    assert attention._yarn_concentration_factor == pytest.approx(want_scale, rel=1e-12)
    if case == "yarn_attention_factor":
        assert want_scale == 1.5

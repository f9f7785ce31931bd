"""Every Hugging Face config field that changes a model's outputs is mapped or refused at
import with its name and value (megatron_mm/hf/config_fields.py), never ignored."""

import importlib.util
import os

import pytest

_spec = importlib.util.spec_from_file_location(
    "convert_hf", os.path.join(os.path.dirname(__file__), "..", "..", "tools", "convert_hf.py"))
convert_hf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_hf)

_TEXT = dict(vocab_size=250, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, image_size=28, patch_size=14)
_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
         "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _lm(kind, **kw):
    from transformers import AutoConfig

    config = AutoConfig.for_model(kind, **{**_TEXT, **kw})
    config.architectures = [_ARCH[kind]]
    return config


def _mrope_lm(**kw):
    """Qwen2.5-VL's M-RoPE text model (its language_flags, as the family calls them)."""
    from transformers import AutoConfig

    return AutoConfig.for_model("qwen2_5_vl_text", **{**_TEXT, **kw})


def _llava(text_kind="llama", text_kw=None, vision="clip_vision_model", vision_kw=None,
           arch="LlavaForConditionalGeneration", **top):
    from transformers import AutoConfig

    text = AutoConfig.for_model(text_kind, **{**_TEXT, **(text_kw or {})})
    tower = AutoConfig.for_model(vision, **{**_VISION, **(vision_kw or {})})
    model_type = "llava_onevision" if "Onevision" in arch else "llava"
    config = AutoConfig.for_model(model_type, text_config=text.to_dict(),
                                  vision_config=tower.to_dict(), image_token_index=249, **top)
    config.architectures = [arch]
    return config


def _audio(**audio_kw):
    from transformers import AutoConfig

    text = AutoConfig.for_model("qwen2", **_TEXT)
    audio = AutoConfig.for_model("qwen2_audio_encoder", d_model=32, encoder_layers=2,
                                 encoder_attention_heads=2, encoder_ffn_dim=64,
                                 num_mel_bins=16, max_source_positions=20, **audio_kw)
    config = AutoConfig.for_model("qwen2_audio", text_config=text.to_dict(),
                                  audio_config=audio.to_dict(), audio_token_id=249)
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    return config


_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_YARN_ROPE = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
              "original_max_position_embeddings": 64}
_MROPE_TEXT = dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                    "mrope_section": [2, 3, 3]})

REFUSED = {
    "rope_type": (lambda: _lm("llama", rope_parameters={"rope_type": "dynamic",
                                                        "rope_theta": 1e4, "factor": 2.0}),
                  "config rope_parameters.rope_type='dynamic' is not supported: the RoPE "
                  "types implemented are 'default', 'llama3'"),
    "llama3_context": (lambda: _lm("llama", rope_scaling={
        **_LLAMA3_ROPE, "original_max_position_embeddings": 128}),
        "config rope_parameters.original_max_position_embeddings=128 is not supported: "
        "Megatron-Core's llama3 RoPE scaling (--use-rope-scaling) fixes low_freq_factor=1, "
        "high_freq_factor=4, original_max_position_embeddings=8192"),
    "llava_llama3_low_freq": (lambda: _llava(text_kw=dict(rope_parameters={
        **_LLAMA3_ROPE, "low_freq_factor": 2.0})),
        "config text_config.rope_parameters.low_freq_factor=2.0 is not supported"),
    "yarn_attention_factor": (lambda: _lm("qwen2", rope_parameters={
        **_YARN_ROPE, "factor": 1.0, "attention_factor": 1.5}),
        "config rope_parameters.attention_factor=1.5 is not supported: with factor <= 1 "
        "Megatron-Core's YaRN scales cos / sin by 1"),
    "yarn_mrope": (lambda: _mrope_lm(rope_parameters={**_YARN_ROPE, "mrope_section": [2, 3, 3]}),
                   "config rope_parameters.rope_type='yarn' is not supported"),
    "partial_rotary": (lambda: _lm("llama", rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
        "config rope_parameters.partial_rotary_factor=0.5 is not supported"),
    "mlp_bias": (lambda: _lm("llama", mlp_bias=True), "config mlp_bias=True is not supported"),
    "attention_bias": (lambda: _lm("llama", attention_bias=True),
                       "config attention_bias=True is not supported"),
    "qwen3_attention_bias": (lambda: _lm("qwen3", attention_bias=True),
                             "config attention_bias=True is not supported"),
    "hidden_act": (lambda: _lm("llama", hidden_act="gelu"),
                   "config hidden_act='gelu' is not supported"),
    "vision_hidden_act": (lambda: _llava(vision_kw=dict(hidden_act="gelu")),
                          "config vision_config.hidden_act='gelu' is not supported"),
    "vision_num_channels": (lambda: _llava(vision_kw=dict(num_channels=1)),
                            "config vision_config.num_channels=1 is not supported"),
    "vision_feature_layers": (lambda: _llava(vision_feature_layer=[-2, -1]),
                              "config vision_feature_layer=[-2, -1] is not supported"),
    "siglip_default_strategy": (
        lambda: _llava("qwen2", vision="siglip_vision_model",
                       vision_kw=dict(hidden_act="gelu_pytorch_tanh"),
                       arch="LlavaOnevisionForConditionalGeneration",
                       vision_feature_select_strategy="default"),
        "config vision_feature_select_strategy='default' is not supported: 'default' drops "
        "a SigLIP patch token"),
    "projector_hidden_act": (lambda: _llava(projector_hidden_act="relu"),
                             "config projector_hidden_act='relu' is not supported"),
    "projector_bias": (lambda: _llava(multimodal_projector_bias=False),
                       "config multimodal_projector_bias=False is not supported"),
    "audio_activation": (lambda: _audio(activation_function="relu"),
                         "config audio_config.activation_function='relu' is not supported"),
    "audio_scale_embedding": (lambda: _audio(scale_embedding=True),
                              "config audio_config.scale_embedding=True is not supported"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_field_that_changes_outputs_is_refused(case):
    from megatron_mm.hf import ConversionError
    from megatron_mm.hf.families import language_flags, model_flags

    build, message = REFUSED[case]
    config = build()
    with pytest.raises(ConversionError) as e:
        model_flags(config) if config.architectures else language_flags(config)
    assert message in str(e.value)


WINDOWS = {  # config -> the longest sequence the converted model takes
    "mistral_window": (lambda: _lm("mistral", sliding_window=16), 16),
    "qwen2_sliding_layer": (lambda: _lm("qwen2", use_sliding_window=True, sliding_window=16,
                                        max_window_layers=1), 16),
    "qwen3_sliding_layers": (lambda: _lm("qwen3", use_sliding_window=True, sliding_window=16,
                                         max_window_layers=0), 16),
    "llava_mistral_window": (lambda: _llava("mistral", dict(sliding_window=16)), 16),
    # Mistral's default window (4096) is longer than any sequence the model takes.
    "mistral_long_window": (lambda: _lm("mistral", sliding_window=4096), 256),
    "mistral_no_window": (lambda: _lm("mistral", sliding_window=None), 256),
    # use_sliding_window with every layer below max_window_layers: no layer slides.
    "qwen2_no_sliding_layer": (lambda: _lm("qwen2", use_sliding_window=True,
                                           sliding_window=16, max_window_layers=2), 256),
}


@pytest.mark.parametrize("case", list(WINDOWS))
def test_a_sliding_window_caps_the_sequence_length(case):
    from megatron_mm.hf.families import model_flags

    build, longest = WINDOWS[case]
    assert model_flags(build())["max_position_embeddings"] == longest


ACCEPTED = {
    "llava_siglip_full": lambda: _llava(
        "qwen2", vision="siglip_vision_model", vision_kw=dict(hidden_act="gelu_pytorch_tanh"),
        arch="LlavaOnevisionForConditionalGeneration", vision_feature_select_strategy="full"),
    "qwen2_audio": _audio,
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_a_reproduced_value_is_accepted(case):
    from megatron_mm.hf.families import model_flags

    assert "num_layers" in model_flags(ACCEPTED[case]())


def test_the_tool_names_the_field(capsys, tmp_path):
    _lm("llama", mlp_bias=True).save_pretrained(tmp_path / "hf")  # config alone
    code = convert_hf.main(["import", "--hf-dir", str(tmp_path / "hf"),
                            "--save", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: config mlp_bias=True is not supported" in err
    assert len(err.strip().splitlines()) == 1


WINDOW = 8


@pytest.mark.processes  # the checkpoint save starts Megatron-Core's SyncManager process
def test_sliding_window_model_equals_hugging_face_up_to_its_window(capsys, tmp_path):
    """A tiny Mistral with an 8-token window: the window changes Hugging Face's logits
    past 8 tokens; the converted model equals them on 8 tokens and refuses longer."""
    import torch
    import transformers
    from megatron_mm.training.cli.arguments import parse_args

    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(_lm("mistral", sliding_window=WINDOW)).eval()
    long = torch.randint(0, 250, (2, WINDOW + 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        windowed = model(input_ids=long).logits
        model.config.sliding_window = None
        full = model(input_ids=long).logits
        model.config.sliding_window = WINDOW
    assert (windowed - full).abs().max() > 1e-3  # the window matters past its length
    hf_dir, ckpt = str(tmp_path / "hf"), str(tmp_path / "ckpt")
    model.save_pretrained(hf_dir)
    assert convert_hf.main(["import", "--hf-dir", hf_dir, "--save", ckpt]) == 0
    capsys.readouterr()
    for tokens, code_wanted in ((long[:, :WINDOW], 0), (long, 2)):
        torch.save({"input_ids": tokens}, str(tmp_path / "inputs.pt"))
        code = convert_hf.main(["compare", "--hf-dir", hf_dir, "--load", ckpt,
                                "--inputs", str(tmp_path / "inputs.pt")])
        out, err = capsys.readouterr()
        assert code == code_wanted, err
        if code == 0:
            diff = float(out.strip().splitlines()[-1].split(": ")[1])
            with capsys.disabled():
                print(f"mistral sliding_window={WINDOW}, {WINDOW} tokens: {diff:.3g}")
            assert diff <= 1e-4
        else:
            assert (f"'input_ids' has {WINDOW + 4} tokens per sequence; the checkpoint "
                    f"takes at most {WINDOW}") in err
    with pytest.raises(SystemExit):
        parse_args(["--load", ckpt, "--seq-length", str(WINDOW + 4)], world_size=1)
    assert (f"--seq-length ({WINDOW + 4}) exceeds --max-position-embeddings ({WINDOW})"
            in capsys.readouterr().err)

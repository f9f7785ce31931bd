"""Hugging Face -> megatron_mm: logits equal the Hugging Face model's at TP=1 for every
family and detail (tiny_models.MODELS: RoPE scaling on sequences longer than the original
context too), and export gives back the same state dict."""

import pytest
import tiny_models
import torch
from parity import load_converted, logits

TOLERANCE = 1e-4  # fp32; measured differences are ~1e-7


@pytest.mark.parametrize("name", list(tiny_models.MODELS))
def test_logits_equal_hugging_face(gloo_world, converted, references, name):
    tokens, pixels, expected = references[name]
    got = logits(load_converted(converted[name][2]), tokens, pixels)
    assert got.shape[-1] == 256  # vocabulary 250 padded for TP=2
    diff = (got[..., :tiny_models.VOCAB] - expected).abs().max().item()
    print(f"{name}: TP=1 max abs logit difference {diff:.3g}")
    assert diff <= TOLERANCE


@pytest.mark.slow
def test_llama3_scaling_equals_hugging_face_past_the_original_context(gloo_world, converted):
    """Llama 3.1's RoPE scaling (Megatron-Core's constants: an original context of 8192) on
    one sequence longer than that context, where the frequencies it divides turn far from
    where they would unscaled (Hugging Face's logits without the scaling differ by ~2e-3)."""
    model, _, ckpt = converted["llava_llama3"]
    tokens, pixels = tiny_models.inputs("llava_llama3", seq=tiny_models.LLAMA3_LONGEST, batch=1)
    expected = tiny_models.reference_logits(model, tokens, pixels)
    got = logits(load_converted(ckpt), tokens, pixels)
    diff = (got[..., :tiny_models.VOCAB] - expected).abs().max().item()
    print(f"llava_llama3, {tokens.shape[1]} tokens: max abs logit difference {diff:.3g}")
    assert diff <= TOLERANCE


@pytest.mark.parametrize("name", list(tiny_models.MODELS))
def test_round_trip_gives_the_same_state_dict(gloo_world, converted, tmp_path, name):
    from megatron_mm.hf.convert import export_hf

    original, _, ckpt = converted[name]
    out = export_hf(ckpt, str(tmp_path / "exported"))
    cls = type(original)
    reloaded, info = cls.from_pretrained(out, output_loading_info=True, dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    want, got = original.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def _write_layout(model, directory, rename):
    from safetensors.torch import save_file

    model.config.save_pretrained(directory)
    tensors = {rename(k): v.contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight" or not model.config.get_text_config().tie_word_embeddings}
    save_file(tensors, f"{directory}/model.safetensors", metadata={"format": "pt"})


LLAVA_LAYOUTS = {
    # transformers 4.x hub files (llava-hf/*)
    "hub_4x": lambda k: (k.replace("model.language_model.", "language_model.model.")
                         .replace("model.vision_tower.", "vision_tower.vision_model.")
                         .replace("model.multi_modal_projector.", "multi_modal_projector.")
                         .replace("lm_head.", "language_model.lm_head.")),
    # transformers 4.52-4.57 save_pretrained
    "save_4_52": lambda k: k.replace("model.vision_tower.", "model.vision_tower.vision_model."),
    # transformers 5.x in-memory names (save_original_format=False)
    "memory_5x": lambda k: k,
}


@pytest.mark.parametrize("layout", list(LLAVA_LAYOUTS))
def test_every_on_disk_layout_imports_the_same(gloo_world, converted, tmp_path, layout):
    from megatron_mm.hf.convert import import_hf

    model, _, reference_ckpt = converted["llava_llama"]
    hf_dir = str(tmp_path / "hf")
    _write_layout(model, hf_dir, LLAVA_LAYOUTS[layout])
    import_hf(hf_dir, str(tmp_path / "ckpt"), tensor_model_parallel_size=2)
    want = load_converted(reference_ckpt).state_dict()
    got = load_converted(str(tmp_path / "ckpt")).state_dict()
    for key, value in want.items():
        if torch.is_tensor(value):
            assert torch.equal(got[key], value), key


def test_export_writes_the_legacy_hub_layout(gloo_world, converted, tmp_path):
    from megatron_mm.hf.convert import export_hf
    from safetensors import safe_open

    out = export_hf(converted["llava_llama"][2], str(tmp_path / "out"))
    with safe_open(f"{out}/model.safetensors", "pt") as f:
        prefixes = {k.split(".")[0] + "." + k.split(".")[1] for k in f.keys()}
    assert prefixes == {"language_model.model", "language_model.lm_head",
                        "vision_tower.vision_model", "multi_modal_projector.linear_1",
                        "multi_modal_projector.linear_2"}


def test_fused_experts_import_as_the_per_expert_ones(gloo_world, converted, tmp_path):
    """transformers 5's in-memory Qwen3-MoE experts (``mlp.experts.gate_up_proj`` /
    ``down_proj``, all experts in one tensor) import as its saved per-expert tensors do."""
    from megatron_mm.hf.convert import import_hf

    model, _, reference_ckpt = converted["qwen3_moe"]
    assert "model.layers.0.mlp.experts.gate_up_proj" in model.state_dict()
    hf_dir = str(tmp_path / "hf")
    _write_layout(model, hf_dir, lambda k: k)
    import_hf(hf_dir, str(tmp_path / "ckpt"), tensor_model_parallel_size=2)
    want = load_converted(reference_ckpt).state_dict()
    got = load_converted(str(tmp_path / "ckpt")).state_dict()
    assert any(".local_experts.3.linear_fc1" in key for key in want)
    for key, value in want.items():
        if torch.is_tensor(value):
            assert torch.equal(got[key], value), key

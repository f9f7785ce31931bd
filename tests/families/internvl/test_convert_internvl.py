"""InternVL (``InternVLForConditionalGeneration``: InternViT + pixel shuffle + LayerNorm/MLP
projector + Qwen2) through ``tools/convert_hf.py``: import, then ``compare`` against
transformers at TP=1, TP=2 and PP=2 on a batch whose images have different aspect ratios
(1, 3 and 4 tiles, tiled by ``data/internvl_media``); export gives back every tensor bit
for bit; both on-disk layouts transformers 5 loads import the same; unsupported config
fields are refused naming the field."""

import importlib.util
import os
import shutil

import numpy as np
import pytest
import torch

TOLERANCE = 1e-4
VOCAB, IMAGE_TOKEN = 250, 249
TILE, PATCH = 28, 7  # 4 x 4 patches -> 2 x 2 = 4 LLM tokens per tile
TEXT = dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-5)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, image_size=TILE, patch_size=PATCH)
VARIANTS = {
    # LayerNorm, cross-head QK norm, QKV bias, tied output layer, last layer
    "qknorm_tied": (dict(norm_type="layer_norm", use_qk_norm=True, attention_bias=True),
                    dict(tie_word_embeddings=True)),
    # RMSNorm, no QK norm / QKV bias, the tower's LayerNorm (unused: layer -2 is taken,
    # as is the last layer), untied output layer
    "rmsnorm_untied_layer-2": (dict(norm_type="rms_norm", use_qk_norm=False,
                                    attention_bias=False, use_mean_pooling=False),
                               dict(tie_word_embeddings=False, vision_feature_layer=-2)),
}
# (height, width) per image: 1, 3 (2x1 + thumbnail) and 4 (1x3 + thumbnail) tiles
IMAGES = ((28, 28), (28, 56), (84, 28))

_spec = importlib.util.spec_from_file_location(
    "convert_hf",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "convert_hf.py"))
convert_hf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_hf)


def hf_model(vision=None, **top):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    config = InternVLConfig(vision_config={**VISION, **(vision or {})},
                            text_config={**TEXT, "tie_word_embeddings":
                                         top.get("tie_word_embeddings", True)},
                            image_token_id=IMAGE_TOKEN, **top)
    config.architectures = ["InternVLForConditionalGeneration"]
    torch.manual_seed(0)
    model = InternVLForConditionalGeneration(config).eval()
    with torch.no_grad():  # random norms, biases, layer scale: a mix-up cannot hide
        for name, p in model.named_parameters():
            if name.startswith(("model.vision_tower.", "model.multi_modal_projector.")):
                p.normal_(0.0, 0.2)
            elif "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def inputs():
    """Two sequences: images 0 and 1 (1 + 3 tiles) in the first, image 2 (4 tiles) in the
    second; pixel values are every image's tiles in order (8 tiles)."""
    from megatron_mm.families.internvl.media import InternVLProcessorConfig, process_images
    from megatron_mm.families.internvl.tiles import InternVLTiling

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in IMAGES]
    cfg = InternVLProcessorConfig(InternVLTiling(tile_size=TILE, patch_size=PATCH,
                                                 max_tiles=4))
    media = process_images(images, cfg)
    assert media.num_tiles == [1, 3, 4]
    per_tile = 4
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, IMAGE_TOKEN, (2, 24), generator=g)
    tokens[0, 1:1 + per_tile] = IMAGE_TOKEN
    tokens[0, 7:7 + 3 * per_tile] = IMAGE_TOKEN
    tokens[1, 3:3 + 4 * per_tile] = IMAGE_TOKEN
    return {"input_ids": tokens, "pixel_values": media.pixel_values,
            "attention_mask": torch.ones_like(tokens)}


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    """Per variant: the model, its save_pretrained directory, its checkpoint (vocabulary
    padded for TP=2), and the inputs file."""
    root = tmp_path_factory.mktemp("internvl")
    path = str(root / "inputs.pt")
    torch.save(inputs(), path)
    out = {}
    for name, (vision, top) in VARIANTS.items():
        model = hf_model(vision, **top)
        hf_dir, ckpt = str(root / name / "hf"), str(root / name / "ckpt")
        model.save_pretrained(hf_dir)
        assert convert_hf.main(["import", "--hf-dir", hf_dir, "--save", ckpt,
                                "--tensor-model-parallel-size", "2"]) == 0
        out[name] = (model, hf_dir, ckpt)
    return out, path


@pytest.mark.parametrize("variant, tp, pp", [
    *((v, 1, 1) for v in VARIANTS),
    # the QK norm's all-reduce; QKV without bias
    *(pytest.param(v, 2, 1, marks=pytest.mark.processes) for v in VARIANTS),
    # tied embedding and output layer on different stages
    pytest.param("qknorm_tied", 1, 2, marks=pytest.mark.processes),
], ids=lambda x: x if isinstance(x, str) else str(x))
def test_compare_equals_hugging_face(capsys, internvl, variant, tp, pp):
    models, inputs_path = internvl
    _, hf_dir, ckpt = models[variant]
    code = convert_hf.main(["compare", "--hf-dir", hf_dir, "--load", ckpt,
                            "--inputs", inputs_path, "--tensor-model-parallel-size", str(tp),
                            "--pipeline-model-parallel-size", str(pp)])
    out, err = capsys.readouterr()
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    prefix = "max abs logit difference: "
    assert last.startswith(prefix), out
    with capsys.disabled():
        print(f"internvl {variant} TP={tp} PP={pp}: {last}")
    assert float(last[len(prefix):]) <= TOLERANCE


def _tensors(directory):
    from safetensors.torch import load_file

    return load_file(os.path.join(directory, "model.safetensors"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_gives_back_every_tensor_bit_for_bit(internvl, tmp_path, variant):
    models, _ = internvl
    _, hf_dir, ckpt = models[variant]
    out = str(tmp_path / "exported")
    assert convert_hf.main(["export", "--load", ckpt, "--hf-dir", out]) == 0
    want, got = _tensors(hf_dir), _tensors(out)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def _rewrite(src, dst, rename):
    from safetensors.torch import save_file

    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    save_file({rename(k): v for k, v in _tensors(src).items()},
              os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


LAYOUTS = {
    # transformers 5's own names (save_pretrained(save_original_format=False))
    "memory_5x": lambda k: (k.replace("language_model.model.", "model.language_model.")
                            .replace("vision_tower.", "model.vision_tower.")
                            .replace("multi_modal_projector.", "model.multi_modal_projector.")
                            .replace("language_model.lm_head.", "lm_head.")),
    # the text model without its ".model" level (transformers 5 maps it as well)
    "language_model_flat": lambda k: k.replace("language_model.model.", "language_model."),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_on_disk_layout_imports_the_same(internvl, tmp_path, layout):
    """Each layout transformers 5 loads gives the checkpoint of the save_pretrained files
    (the legacy prefixes of the -hf hub checkpoints)."""
    from transformers import InternVLForConditionalGeneration

    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world
    from megatron_mm.hf.compare import load_converted

    models, _ = internvl
    model, hf_dir, reference = models["rmsnorm_untied_layer-2"]
    other = str(tmp_path / "hf")
    _rewrite(hf_dir, other, LAYOUTS[layout])
    _, info = InternVLForConditionalGeneration.from_pretrained(other, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys")), info
    with single_rank_world():  # convert_hf's own world (the fixture's tools end theirs)
        import_hf(other, str(tmp_path / "ckpt"), tensor_model_parallel_size=2)
        want = load_converted(reference).state_dict()
        got = load_converted(str(tmp_path / "ckpt")).state_dict()
    for key, value in want.items():
        if torch.is_tensor(value):
            assert torch.equal(got[key], value), key


@pytest.mark.parametrize("vision, top, message", [
    ({}, dict(vision_feature_select_strategy="full"),
     "config vision_feature_select_strategy='full' is not supported"),
    (dict(use_mask_token=True), {},
     "config vision_config.use_mask_token=True is not supported"),
    (dict(hidden_act="relu"), {}, "config vision_config.hidden_act='relu' is not supported"),
    ({}, dict(projector_hidden_act="silu"),
     "config projector_hidden_act='silu' is not supported"),
], ids=["select_full", "mask_token", "relu_tower", "silu_projector"])
def test_unsupported_config_field_is_refused(capsys, tmp_path, vision, top, message):
    hf_dir = str(tmp_path / "hf")
    hf_model(vision, **top).save_pretrained(hf_dir)
    capsys.readouterr()  # save_pretrained's progress bar
    code = convert_hf.main(["import", "--hf-dir", hf_dir, "--save", str(tmp_path / "ckpt")])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err

"""InternVL's vision side (InternViT, pixel shuffle, projector) on Megatron-Core layers
against transformers' ``InternVLModel.get_image_features`` (tiny random
``InternVLForConditionalGeneration``s, every weight randomised, layer scale included):
two configs (LayerNorm + QK norm + QKV bias; RMSNorm + the tower's final LayerNorm, no QK
norm, no QKV bias), an earlier ``vision_feature_layer``, position embeddings resized to
another tile size, the weight table both ways and from ``save_pretrained`` files, TP=2
equal to TP=1, and no host syncs."""

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")

from megatron_mm.config import ConfigError  # noqa: E402

TOLERANCE = 1e-5
TILES = 3  # a batch of tiles (InternVL's processor concatenates every image's tiles)
TEXT = dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, image_size=56, patch_size=14)
VARIANTS = {
    "layernorm_qknorm_bias": dict(norm_type="layer_norm", use_qk_norm=True,
                                  attention_bias=True),
    "rmsnorm_final_norm": dict(norm_type="rms_norm", use_qk_norm=False,
                               attention_bias=False, use_mean_pooling=False),
}
HEADS = {"vision": (4, 4)}


def _hf_model(vision=None, **top):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    config = InternVLConfig(vision_config={**VISION, **(vision or {})}, text_config=TEXT,
                            image_token_id=250, **top)
    torch.manual_seed(0)
    model = InternVLForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms start at 1, biases and layer scale at constants
        for name, p in _vision_params(model):
            p.normal_(0.0, 0.2)
    return model


def _vision_params(hf):
    return [(k, p) for k, p in hf.named_parameters()
            if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))]


def _vision_state(hf):
    return {k: p.detach().clone() for k, p in _vision_params(hf)}


def _pixels(side=56, tiles=TILES):
    return torch.randn(tiles, 3, side, side, generator=torch.Generator().manual_seed(1))


def _table(**prefixes):
    from megatron_mm.families.internvl.hf_table import internvit_rules
    from megatron_mm.hf.mapping import MappingTable

    return MappingTable(internvit_rules(**prefixes))


def _build(hf_config):
    from megatron.core import parallel_state

    from megatron_mm.families.internvl.model import InternViTWithProjector
    from megatron_mm.families.internvl.config import InternViTConfig
    from megatron_mm.families.internvl.transformer_config import (
        internvit_transformer_config,
        internvl_projector_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = InternViTConfig.from_hf(hf_config)
    s = BuildSettings(
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size())
    return InternViTWithProjector(internvit_transformer_config(enc, s),
                                  internvl_projector_transformer_config(enc, s), enc)


def _names(model):
    return {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}


def _imported(state, hf_config, **prefixes):
    """A Megatron model (this world's TP must be 1) with the Hugging Face weights; every
    Hugging Face tensor used."""
    from megatron_mm.hf.transforms import Context

    model = _build(hf_config)
    mapped, used = _table(**prefixes).to_megatron(state, _names(model), Context(HEADS))
    assert used == set(state), set(state) - used
    model.load_state_dict({**model.state_dict(), **mapped}, strict=True)
    return model


def _reference(hf, pixels, weights):
    """Hugging Face's image features and the gradients of sum(features * weights)."""
    out = hf.model.get_image_features(pixel_values=pixels).pooler_output
    hf.zero_grad()
    (out * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in _vision_params(hf)}
    return out.detach(), grads


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def case(request):
    hf = _hf_model(VARIANTS[request.param])
    pixels = _pixels()
    weights = torch.randn(TILES, 4, TEXT["hidden_size"],
                          generator=torch.Generator().manual_seed(2))
    out, grads = _reference(hf, pixels, weights)
    return dict(name=request.param, hf=hf, config=hf.config, state=_vision_state(hf),
                out=out, grads=grads, pixels=pixels, weights=weights)


def test_features_and_gradients_equal_hugging_face(gloo_world, case):
    from megatron_mm.hf.transforms import Context

    model = _imported(case["state"], case["config"])
    out = model(case["pixels"])
    diff = (out - case["out"]).abs().max().item()
    print(f"InternViT {case['name']}, TP=1: max abs diff {diff:.3g} "
          f"(|out| max {case['out'].abs().max().item():.3g})")
    assert out.shape == (TILES, 4, TEXT["hidden_size"])  # 4x4 patches -> 2x2 tokens
    assert diff <= TOLERANCE

    (out * case["weights"]).sum().backward()
    expected, _ = _table().to_megatron(case["grads"], _names(model), Context(HEADS))
    worst = 0.0  # relative to the tensor's largest gradient
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        scale = expected[name].abs().max().item()
        worst = max(worst, (p.grad - expected[name]).abs().max().item() / scale)
    print(f"max gradient diff relative to the largest gradient: {worst:.3g}")
    assert worst <= 1e-5


def test_import_export_round_trip_is_bit_identical(gloo_world, case):
    from megatron_mm.hf.transforms import Context

    model = _imported(case["state"], case["config"])
    back = _table().to_hf(_names(model), Context(HEADS))
    assert set(back) == set(case["state"])
    for name, tensor in case["state"].items():
        assert back[name].shape == tensor.shape and torch.equal(back[name], tensor), name


def test_forward_and_backward_read_no_device_value(gloo_world, case):
    from host_syncs import HostSyncCounter

    model = _imported(case["state"], case["config"])
    counter = HostSyncCounter()
    with counter.active():
        (model(case["pixels"]) * case["weights"]).sum().backward()
    assert counter.found == []


def test_layer_scale_and_qk_norm_matter(gloo_world, case):
    """The random layer scale (and QK norm where the config has it) change the features
    by far more than the parity tolerance, so the parity test checks them."""
    model = _imported(case["state"], case["config"])
    layer = model.vision_model.decoder.layers[0]
    with torch.no_grad():
        layer.ls1.fill_(1.0)
        assert (model(case["pixels"]) - case["out"]).abs().max() > 10 * TOLERANCE
        model = _imported(case["state"], case["config"])
        norm = model.vision_model.decoder.layers[0].self_attention.q_layernorm
        if case["config"].vision_config.use_qk_norm:
            norm.weight.fill_(1.0)
            assert (model(case["pixels"]) - case["out"]).abs().max() > 10 * TOLERANCE
        else:
            assert norm is None


def test_earlier_feature_layer_builds_only_the_layers_it_needs(gloo_world):
    """vision_feature_layer=-2 of 2 layers: Hugging Face's hidden_states[-2], the first
    layer's output; the Megatron model builds that one layer, the table maps it (the
    second layer's weights are not the model's)."""
    from megatron_mm.hf.transforms import Context

    hf = _hf_model(VARIANTS["rmsnorm_final_norm"], vision_feature_layer=-2)
    pixels = _pixels()
    with torch.no_grad():
        ref = hf.model.get_image_features(pixel_values=pixels).pooler_output
    state = _vision_state(hf)
    model = _build(hf.config)
    assert len(model.vision_model.decoder.layers) == 1
    assert model.vision_model.ln_post is None  # the tower's norm only follows layer -1
    mapped, used = _table().to_megatron(state, _names(model), Context(HEADS))
    assert set(state) - used == {k for k in state if ".encoder.layer.1." in k
                                 or ".vision_tower.layernorm." in k}
    model.load_state_dict({**model.state_dict(), **mapped})
    with torch.no_grad():
        assert (model(pixels) - ref).abs().max() <= TOLERANCE


def test_activation_recompute_gives_the_same_step(gloo_world, case):
    """--recompute-granularity full: the layer-scaled layers rerun in backward; output
    and gradients unchanged."""
    from megatron_mm.families.internvl.model import InternViTWithProjector
    from megatron_mm.families.internvl.config import InternViTConfig
    from megatron_mm.families.internvl.transformer_config import (
        internvit_transformer_config,
        internvl_projector_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = InternViTConfig.from_hf(case["config"])
    s = BuildSettings(recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)
    model = InternViTWithProjector(internvit_transformer_config(enc, s),
                                   internvl_projector_transformer_config(enc, s), enc)
    plain = _imported(case["state"], case["config"])
    model.load_state_dict(plain.state_dict())
    grads = []
    for m in (plain, model):
        m.train()
        (m(case["pixels"]) * case["weights"]).sum().backward()
        grads.append({k: p.grad for k, p in m.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_other_tile_sizes_resize_the_position_grid(gloo_world):
    """A model trained at 28 px (2x2 patches) fed 56 px tiles: Hugging Face resizes its
    position embeddings bicubically, and so does the Megatron model; 28 px tiles use them
    as they are."""
    hf = _hf_model({**VARIANTS["layernorm_qknorm_bias"], "image_size": 28})
    model = _imported(_vision_state(hf), hf.config)
    for side, tokens in ((56, 4), (28, 1)):
        pixels = _pixels(side)
        with torch.no_grad():
            ref = hf.model.get_image_features(pixel_values=pixels).pooler_output
            out = model(pixels)
        assert out.shape == (TILES, tokens, TEXT["hidden_size"])
        assert (out - ref).abs().max() <= TOLERANCE, side


def test_table_reads_the_saved_files(gloo_world, case, tmp_path):
    """``save_pretrained`` writes ``vision_tower.`` / ``multi_modal_projector.`` (the
    ``-hf`` hub layout); the table under those prefixes imports the same model."""
    from safetensors.torch import load_file

    case["hf"].save_pretrained(tmp_path)
    files = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        files.update(load_file(f))
    state = {k: v for k, v in files.items()
             if k.startswith(("vision_tower.", "multi_modal_projector."))}
    assert len(state) == len(case["state"])
    model = _imported(state, case["config"], vision_hf_prefix="vision_tower.",
                      projector_hf_prefix="multi_modal_projector.")
    with torch.no_grad():
        assert (model(case["pixels"]) - case["out"]).abs().max() <= TOLERANCE


def test_pixel_shuffle_is_hugging_faces(case):
    """Including its transposes, on a non-square grid where a wrong order shows."""
    from megatron_mm.families.internvl.model import pixel_shuffle

    x = torch.randn(2, 6, 4, 8)
    assert torch.equal(pixel_shuffle(x), case["hf"].model.pixel_shuffle(x, 0.5))


def _tp_worker(rank, state, hf_config, pixels, weights, ckpt_dir):
    """TP=1 on both ranks saves the imported weights as a distributed checkpoint; TP=2
    loads it (Megatron-Core reshards: QKV per group, the q/k norm weights by heads) and
    runs the same tiles."""
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.distributed.init_process_group("gloo")
    results = {}
    for tp in (1, 2):
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tp, 1)
        model_parallel_cuda_manual_seed(1234)
        if tp == 1:
            model = _imported(state, hf_config)
            dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
            torch.distributed.barrier()
        else:
            model = _build(hf_config)
            attn = model.vision_model.decoder.layers[0].self_attention
            assert attn.linear_qkv.weight.shape == (3 * 32 // 2, 32)  # 2 of 4 heads
            assert attn.q_layernorm.weight.shape == (16,)
            loaded = dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir)
            model.load_state_dict(loaded, strict=True)
        out = model(pixels)
        (out * weights).sum().backward()
        grads = {}  # this rank's part of each gradient (TP=1: the whole)
        for k, p in model.named_parameters():
            split = tp > 1 and getattr(p, "tensor_model_parallel", False)
            grads[k] = (p.grad.clone(), p.partition_dim if split else None)
        results[tp] = (out.detach(), grads)
    parallel_state.destroy_model_parallel()
    return results


@pytest.mark.processes
def test_tensor_parallel_equals_one_process(tmp_path):
    """The QK-norm config: its norm spans the heads of both ranks."""
    from dist_harness import run_distributed

    hf = _hf_model(VARIANTS["layernorm_qknorm_bias"])
    pixels = _pixels()
    weights = torch.randn(TILES, 4, TEXT["hidden_size"])
    with torch.no_grad():
        ref = hf.model.get_image_features(pixel_values=pixels).pooler_output
    results = run_distributed(_tp_worker, 2, _vision_state(hf), hf.config, pixels, weights,
                              str(tmp_path))
    for rank, res in enumerate(results):
        (out1, g1), (out2, g2) = res[1], res[2]
        diff = (out2 - out1).abs().max().item()
        hf_diff = (out2 - ref).abs().max().item()
        print(f"rank {rank}: TP=2 vs TP=1 max abs diff {diff:.3g}, vs HF {hf_diff:.3g}")
        assert diff <= TOLERANCE and hf_diff <= TOLERANCE
        assert set(g1) == set(g2)
        for name, (grad2, dim) in g2.items():
            grad1 = g1[name][0]
            if dim is not None:  # linear_qkv rows are per group: rank r's are a chunk
                grad1 = grad1.chunk(2, dim=dim)[rank]
            assert torch.allclose(grad2, grad1, atol=1e-5, rtol=1e-4), name


def test_bad_input_is_a_clear_error(gloo_world, case):
    model = _imported(case["state"], case["config"])
    with pytest.raises(ValueError, match="must be square"):
        model(torch.randn(1, 3, 56, 28))
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        model(torch.randn(1, 3, 42, 42))
    with pytest.raises(ValueError, match=r"\[tiles, 3, H, W\]"):
        model(torch.randn(1, 1, 56, 56))


def test_config_refuses_what_it_does_not_implement(case):
    from megatron_mm.families.internvl.model import internvit_layer_spec
    from megatron_mm.families.internvl.config import InternViTConfig

    cfg = case["config"]

    def changed(**fields):
        new = type(cfg)(**{**cfg.to_dict(), **fields})
        new.text_config = cfg.text_config
        return new

    def vision(**fields):
        return changed(vision_config={**cfg.vision_config.to_dict(), **fields})

    for bad, match in (
            (changed(vision_feature_select_strategy="full"), "vision_feature_select_strategy"),
            (changed(vision_feature_layer=[-1, -2]), "vision_feature_layer"),
            (changed(vision_feature_layer=0), "patch embeddings"),
            (changed(vision_feature_layer=-4), "not an index"),
            (changed(projector_hidden_act="silu"), "projector_hidden_act"),
            (changed(downsample_ratio=0.4), "downsample_ratio"),
            (vision(hidden_act="relu"), "hidden_act"),
            (vision(use_mask_token=True), "use_mask_token"),
            (vision(use_absolute_position_embeddings=False), "position embeddings"),
            (vision(image_size=[56, 28]), "square"),
            (vision(image_size=42), "pixel shuffle")):
        with pytest.raises(ConfigError, match=match):
            InternViTConfig.from_hf(bad)
    with pytest.raises(ConfigError, match="transformer_engine"):
        internvit_layer_spec(InternViTConfig(), "transformer_engine")


def test_encoder_tensor_parallel_of_its_own_is_refused(gloo_world):
    """The QK norm reduces over the global TP group: an encoder TP that differs is an
    error, not a wrong norm."""
    from megatron_mm.families.internvl.model import InternViTWithProjector
    from megatron_mm.families.internvl.config import InternViTConfig
    from megatron_mm.families.internvl.transformer_config import (
        internvit_transformer_config,
        internvl_projector_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = InternViTConfig(hidden_size=32, num_attention_heads=4, num_layers=1,
                          ffn_hidden_size=64, image_size=56, qk_norm=True)
    s = BuildSettings(encoder_tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match="encoder TP of 2"):
        InternViTWithProjector(internvit_transformer_config(enc, s),
                               internvl_projector_transformer_config(enc, BuildSettings()),
                               enc)


def test_embedding_reads_its_parameters_inside_their_owners_call(gloo_world, case):
    """Megatron-Core DDP's ``--overlap-param-gather`` waits for a bucket's all-gather in the
    forward pre-hook of a module that owns the parameter (``parameters(recurse=False)``);
    the multimodal model calls the tower's ``embed`` directly, so the class token and the
    position table must be read inside the tower's own call."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    tower = _build(case["config"]).vision_model
    gathered, early = set(), []
    for module in tower.modules():
        module.register_forward_pre_hook(
            lambda m, args: gathered.update(m.parameters(recurse=False)))
    names = {p: n for n, p in tower.named_parameters()}

    class ReadsBeforeHook(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "__get__":  # dtype, shape: not the values
                return func(*args, **(kwargs or {}))
            for v in tree_flatten((args, kwargs or {}))[0]:
                if isinstance(v, torch.nn.Parameter) and v not in gathered:
                    early.append(names[v])
            return func(*args, **(kwargs or {}))

    with ReadsBeforeHook():
        tower.embed(case["pixels"])
    assert early == []

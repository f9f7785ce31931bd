"""Local <-> Transformer Engine names of every weight (LLM, CLIP/SigLIP ViT, Whisper-style
audio encoder, projectors), checked against the parameter names Megatron-Core's TE specs
produce. TE cannot be installed here, so its layers' names come from Megatron-Core's own
spec code (walked below: which TE class sits at which submodule) and, per TE class, the
parameters it registers (``TE_PARAMETERS``, read off TransformerEngine's modules)."""

import dataclasses
import importlib.util
import re

import pytest
import torch

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig, ProjectorConfig
from megatron_mm.families.whisper.config import AudioEncoderConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models.te_names import LOCAL_TO_TE, is_module_state, to_local, to_te

IMAGE_ID, AUDIO_ID = 250, 251

# Parameters each TE module registers, besides the ``_extra_state`` every one of them has
# (transformer_engine/pytorch/module/layernorm_linear.py, linear.py; attention's
# DotProductAttention has none; Megatron-Core's TENorm gives te.pytorch.LayerNorm /
# RMSNorm: weight, bias). LayerNormLinear registers layer_norm_bias only for LayerNorm,
# and a linear's bias only with bias=True.
TE_PARAMETERS = {
    "TELayerNormColumnParallelLinear": {"weight", "bias", "layer_norm_weight",
                                        "layer_norm_bias"},
    "TEColumnParallelLinear": {"weight", "bias"},
    "TERowParallelLinear": {"weight", "bias"},
    "TEDotProductAttention": set(),
    "TENorm": {"weight", "bias"},
}


def _te_class_names():
    """Megatron-Core's TE classes by identity (placeholders when TE is absent)."""
    from megatron.core.extensions import transformer_engine as te

    return {id(getattr(te, n)): n for n in TE_PARAMETERS}


def _walk(spec, path=""):
    """(submodule path, module class) of every leaf of a layer spec."""
    import functools

    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(spec, functools.partial) and "submodules" in spec.keywords:
        spec = spec.keywords["submodules"]  # MLP.as_mlp_submodule(submodules=...)
    if isinstance(spec, ModuleSpec):
        if spec.submodules is None:
            yield path, spec.module
            return
        spec = spec.submodules
    if hasattr(spec, "__dataclass_fields__"):
        for field in spec.__dataclass_fields__:
            if field == "sharded_state_dict_keys_map":
                continue
            yield from _walk(getattr(spec, field), f"{path}{field}.")
    else:
        yield path, spec


def te_layer_modules(spec) -> dict:
    """Submodule path -> TE class name, for every TE module of Megatron-Core's layer spec."""
    names = _te_class_names()
    return {path.rstrip("."): names[id(cls)] for path, cls in _walk(spec) if id(cls) in names}


@pytest.fixture(scope="module")
def te_specs():
    """Megatron-Core's TE layer specs, from its own spec code. Without TE its GPT spec
    function finds no ``TESpecProvider``: hand it the real class (whose TE layers are then
    placeholders, identified by identity)."""
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.vision import vit_layer_specs

    saved = gpt_layer_specs.TESpecProvider
    gpt_layer_specs.TESpecProvider = TESpecProvider
    try:
        return {"language": te_layer_modules(
                    gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
                        qk_layernorm=True)),
                "encoder": te_layer_modules(
                    vit_layer_specs.get_vit_layer_with_transformer_engine_spec())}
    finally:
        gpt_layer_specs.TESpecProvider = saved


def _model_config():
    return MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(hidden_size=32, num_layers=1,
                                                num_attention_heads=2, img_h=8, img_w=8,
                                                patch_dim=4),
                  "audio": AudioEncoderConfig(hidden_size=32, num_layers=1,
                                              num_attention_heads=2, num_mel_bins=16,
                                              max_source_positions=12, pool_stride=2)},
        projectors={"audio": ProjectorConfig("affine")},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4,
                                     num_query_groups=2, qk_layernorm=True,
                                     add_qkv_bias=True))


def _build():
    from megatron_mm.models import BuildSettings, build_model

    return build_model(_model_config(), BuildSettings(),
                       {"image": IMAGE_ID, "audio": AUDIO_ID})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU environment may hold TE")
def test_the_cpu_environment_has_no_transformer_engine():
    # Its import raises a RuntimeError here (no CUDA libraries) that breaks megatron.core.
    assert importlib.util.find_spec("transformer_engine") is None


def test_local_to_te_is_megatron_cores_own_key_map():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    assert LOCAL_TO_TE == get_gpt_layer_local_spec(
        normalization="RMSNorm").submodules.sharded_state_dict_keys_map


def test_megatron_cores_te_specs_fuse_the_pre_norms(te_specs):
    for stack, modules in te_specs.items():
        assert modules["self_attention.linear_qkv"] == \
            "TELayerNormColumnParallelLinear", stack
        assert modules["mlp.linear_fc1"] == "TELayerNormColumnParallelLinear"
        assert modules["self_attention.core_attention"] == "TEDotProductAttention"
        assert not any(p.startswith(("input_layernorm", "pre_mlp_layernorm"))
                       for p in modules), stack  # IdentityOp there: fused


def _te_parameter_names(modules: dict, layer_prefix: str) -> dict:
    """TE parameter name (in the model) -> its TE class, for one layer's spec modules."""
    out = {}
    for path, cls in modules.items():
        for p in TE_PARAMETERS[cls] | {"_extra_state"}:
            out[f"{layer_prefix}{path}.{p}"] = cls
    return out


@pytest.mark.parametrize("stack, spec", [("language_model", "language"),
                                         ("vision_model", "encoder"),
                                         ("audio_model", "encoder")])
def test_every_local_weight_has_its_te_name(gloo_world, te_specs, stack, spec):
    model = _build()
    prefix = f"{stack}.decoder.layers.0."
    local = [n for n in model.state_dict() if n.startswith(prefix)]
    te_names = _te_parameter_names(te_specs[spec], prefix)
    renamed = {to_te(n): n for n in local}
    fused = {n for n in renamed if "layer_norm_" in n}
    assert fused == {n for n in te_names if ".layer_norm_" in n
                     and (spec == "encoder" or not n.endswith("_bias"))}  # LLM: RMSNorm
    for te_name, name in renamed.items():
        if ".q_layernorm." in te_name or ".k_layernorm." in te_name:
            continue  # TENorm (TE >= 1.9) or Apex's norm: weight in either
        assert te_name in te_names, f"{name} -> {te_name}: not a parameter of the TE layer"
        assert to_local(te_name) == name
    # Each TE module's weight comes from a local one (TE registers nothing we leave empty).
    for te_name, cls in te_names.items():
        if te_name.endswith(".weight") and cls != "TEDotProductAttention":
            assert te_name in renamed, te_name


def test_names_outside_layers_and_table_patterns():
    assert to_te("decoder.layers.{i}.input_layernorm.weight") == \
        "decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight"
    # Outside the layers TE keeps the names: TENorm (ln_pre, ln_post, final norm) and the
    # projectors' TEColumnParallelLinear / TERowParallelLinear have weight and bias.
    for name in ("vision_model.ln_pre.weight", "audio_model.ln_post.bias",
                 "vision_projection.encoder.linear_fc1.weight",
                 "audio_projection.encoder.bias"):
        assert to_te(name) == name
    assert to_te("language_model.decoder.final_layernorm.weight") == \
        "language_model.decoder.final_layernorm.weight"
    assert is_module_state("x.layers.0.self_attention.core_attention._extra_state")
    assert not is_module_state("x.layers.0.self_attention.linear_qkv.weight")


def test_hugging_face_tables_serve_te_models(gloo_world):
    """The Qwen2-Audio and LLaVA tables give a TE-named state dict (with TE's module state)
    the same Hugging Face tensors as the local one, and back."""
    from megatron_mm.hf.mapping import MappingTable
    from megatron_mm.families.vit.hf_table import llava_rules
    from megatron_mm.families.whisper.hf_table import qwen2_audio_rules
    from megatron_mm.hf.transforms import Context

    model = _build()
    local = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
    ctx = Context(heads={"language": (4, 2), "vision": (2, 2), "audio": (2, 2)},
                  vocab_size=256, padded_vocab_size=256)
    vision_rules = [r for r in llava_rules()
                    if r.megatron.startswith(("vision_model.", "vision_projection."))]
    rules = list(qwen2_audio_rules()) + vision_rules
    hf = MappingTable(rules).to_hf(local, ctx)
    te_sd = {to_te(k): v for k, v in local.items()}
    te_sd["language_model.decoder.layers.0.self_attention.core_attention._extra_state"] = \
        torch.empty(0, dtype=torch.uint8)
    te_table = MappingTable(rules, "transformer_engine")
    assert te_table.to_hf(te_sd, ctx).keys() == hf.keys()
    for name, value in te_table.to_hf(te_sd, ctx).items():
        assert torch.equal(value, hf[name]), name
    back, used = te_table.to_megatron(hf, te_sd, ctx)
    assert used == set(hf)
    assert back.keys() == {k for k in te_sd if not is_module_state(k)}
    for name, value in back.items():
        assert torch.equal(value, te_sd[name]), name
    assert any("linear_qkv.layer_norm_bias" in k for k in back)  # the ViT's fused LayerNorm


class _WithExtraState:
    """Stands in for TE module state that a local checkpoint lacks: on the core attention,
    state TE's ``TEDotProductAttention`` holds but never checkpoints; on a norm (TE's
    ``TENorm`` where the local layer has a torch norm), state that is checkpointed.
    (Megatron-Core's local linears already checkpoint an ``_extra_state``, as TE's do.)"""

    def get_extra_state(self):
        return {"fp8_meta": "amax history"}

    def set_extra_state(self, state):
        self.loaded_extra_state = state


def _give_extra_state(model):
    for layer in model.language_model.decoder.layers:
        core = layer.self_attention.core_attention
        core.__class__ = type("WithExtraState", (_WithExtraState, type(core)), {})
    norm = model.vision_model.ln_pre
    norm.__class__ = type("WithExtraState", (_WithExtraState, type(norm)), {})


def _args(tmp_path):
    from megatron_mm.training.cli.arguments import parse_run_config

    flags = ["--save", str(tmp_path), "--no-save-optim", "--no-save-rng", "--no-load-optim",
             "--no-load-rng", "--micro-batch-size", "1"]
    config = parse_run_config(flags, world_size=1)  # --load: given below, not read here
    return dataclasses.replace(
        config, model_config=_model_config(),
        checkpoint=dataclasses.replace(config.checkpoint, load=str(tmp_path)))


# Megatron-Core's checkpoint save starts a SyncManager process (the first in a session).
@pytest.mark.processes
def test_checkpoints_carry_te_names_and_load_across_impls(gloo_world, tmp_path):
    from megatron.core import dist_checkpointing

    from megatron_mm.training.checkpoint.checkpointing import (
        CheckpointError, load_checkpoint, save_checkpoint)

    saved = _build()
    path = save_checkpoint(_args(tmp_path / "local"), 1, [saved], None, None)
    keys = set(dist_checkpointing.load_tensors_metadata(path))
    # Saved with local specs, named as TE layers are (the ViT's and audio encoder's too).
    # (Megatron-Core stacks a block's layers into one tensor: no layer index in the key.)
    assert keys == {re.sub(r"\.layers\.\d+\.", ".layers.", to_te(k))
                    for k, v in saved.state_dict().items() if torch.is_tensor(v)}
    for stack in ("vision_model", "audio_model"):
        assert f"{stack}.decoder.layers.mlp.linear_fc1.layer_norm_bias" in keys
    # Local checkpoint -> a model whose modules carry TE's module state: loads, keeps it.
    with_state = _build()
    _give_extra_state(with_state)
    load_checkpoint(_args(tmp_path / "local"), [with_state], None, None)
    for name, value in saved.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(with_state.state_dict()[name], value), name
    # ... and back: its checkpoint (module state included) loads into plain local layers.
    save_checkpoint(_args(tmp_path / "te"), 1, [with_state], None, None)
    plain = _build()
    load_checkpoint(_args(tmp_path / "te"), [plain], None, None)
    reloaded = _build()
    _give_extra_state(reloaded)
    load_checkpoint(_args(tmp_path / "te"), [reloaded], None, None)
    assert reloaded.vision_model.ln_pre.loaded_extra_state == {"fp8_meta": "amax history"}
    # A missing weight is still an error, named.
    extra = _build()
    extra.vision_model.decoder.layers[0].mlp.linear_fc2.register_parameter(
        "extra", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(CheckpointError, match="lacks 1 tensors"):
        load_checkpoint(_args(tmp_path / "local"), [extra], None, None)

"""Qwen3-VL-MoE (Qwen3-VL's tower and DeepStack in front of a Qwen3-MoE LLM, fused expert
tensors) -> megatron_mm: on Qwen3-VL's batch (two images of different sizes and a
two-frame video), ``compare``'s logits equal transformers' at TP=1, EP=2 and PP=2 x EP=2
(the cut between two DeepStack layers; max |diff| <= 1e-4, fp32) with a dense layer among
the sparse ones; export gives back the same tensors, also from a checkpoint saved at EP=2;
both fused orientations import; config fields the model does not reproduce are refused."""

import pytest
import torch
from tiny_qwen3_vl import SEQ, VOCAB, config, inputs, tiny

from megatron_mm.hf.errors import ConversionError

TOLERANCE = 1e-4
# Experts of 24 (2 x 24 and 24 differ from the hidden 64: each fused orientation has its
# own shape); LLM layer 1 dense (mlp_only_layers), layers 0, 2, 3 MoE.
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
           decoder_sparse_step=1, mlp_only_layers=[1])


def _config(text=None, **vision):
    return config("Qwen3VLMoe", text, MOE, **vision)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen3_vl_moe")
    model = tiny(_config())
    model.save_pretrained(str(root / "hf"))
    with single_rank_world():
        import_hf(str(root / "hf"), str(root / "ckpt"))
    return model, str(root / "hf"), str(root / "ckpt")


@pytest.mark.parametrize("tp,pp,ep", [
    (1, 1, 1),
    # LLM layers 0, 1 | 2, 3: the DeepStack feature of layer 2 crosses the cut; each stage
    # has MoE layers, their experts split over EP=2 (EP alone adds nothing to check)
    pytest.param(1, 2, 2, marks=pytest.mark.processes),
    # sequence parallelism (the MoE layers need it): DeepStack's features added to shards
    pytest.param(2, 1, 1, marks=pytest.mark.processes),
    pytest.param(2, 1, 2, marks=pytest.mark.processes)])
def test_logits_equal_transformers(converted, tp, pp, ep):
    from megatron_mm.hf.compare import compare

    _, hf_dir, ckpt = converted
    diff, shape = compare(hf_dir, ckpt, inputs(), tp=tp, pp=pp, ep=ep)
    print(f"qwen3-vl-moe TP={tp} PP={pp} EP={ep}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE


def _assert_same_model(original, out):
    reloaded, info = type(original).from_pretrained(out, output_loading_info=True,
                                                    dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    want, got = original.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_round_trip_is_bit_identical(converted, gloo_world, tmp_path):
    from megatron_mm.hf.convert import export_hf

    original, _, ckpt = converted
    _assert_same_model(original, export_hf(ckpt, str(tmp_path / "exported")))


@pytest.mark.processes
def test_checkpoint_saved_at_ep2_exports_the_same_tensors(converted, gloo_world, tmp_path):
    from resave_workers import export_saved_at

    original, _, ckpt = converted
    _assert_same_model(original, export_saved_at(ckpt, str(tmp_path), 1, 1, 2))


def test_both_fused_orientations_import(converted):
    """The hub's [E, H, 2I] / [E, I, H] experts split into the same per-expert tensors as
    transformers 5's [E, 2I, H] / [E, H, I]; export writes the orientation recorded at
    import (transformers 5's where none was)."""
    from megatron_mm.hf.families import family_for

    original, _, _ = converted
    layout = family_for(original.config).layout
    memory = original.state_dict()
    hub = {k: (v.transpose(1, 2).contiguous() if k.endswith(("gate_up_proj", "down_proj"))
               else v) for k, v in memory.items()}
    want, got = layout.normalise(memory), layout.normalise(hub)
    assert got.keys() == want.keys()
    assert "model.language_model.layers.0.mlp.experts.3.up_proj.weight" in got
    assert all(torch.equal(got[k], v) for k, v in want.items())
    for files, recorded in ((hub, layout.recorded(hub)), (memory, layout.recorded(memory)),
                            (memory, None)):
        written = layout.written(want, recorded)
        assert written.keys() == files.keys()
        assert all(torch.equal(written[k], v) for k, v in files.items())


@pytest.mark.parametrize("hub", [False, True])
def test_export_writes_the_files_imported(tmp_path, gloo_world, hub):
    """Files saved by transformers 5 ([E, 2I, H] / [E, H, I]), or the hub's transposed
    ones, come back from import + export as they went in: every tensor equal, same
    shapes."""
    from safetensors.torch import load_file, save_file

    from megatron_mm.hf.convert import export_hf, import_hf

    hf_dir = tmp_path / "hf"
    tiny(_config()).save_pretrained(str(hf_dir))
    files = load_file(str(hf_dir / "model.safetensors"))
    if hub:
        files = {k: (v.transpose(1, 2).contiguous()
                     if k.endswith(("gate_up_proj", "down_proj")) else v)
                 for k, v in files.items()}
        save_file(files, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    import_hf(str(hf_dir), str(tmp_path / "ckpt"))
    out = load_file(export_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"))
                    + "/model.safetensors")
    assert out.keys() == files.keys()
    assert all(torch.equal(out[k], v) for k, v in files.items())


@pytest.mark.parametrize("text,vision,field", [
    (dict(num_experts=0), {}, "text_config.num_experts=0"),
    (dict(hidden_act="gelu"), {}, "text_config.hidden_act='gelu'"),
    ({}, dict(hidden_act="gelu"), "vision_config.hidden_act='gelu'"),
])
def test_unsupported_config_fields_are_refused(text, vision, field):
    from megatron_mm.hf.families import model_flags

    with pytest.raises(ConversionError, match=field):
        model_flags(_config(text, **vision))


def test_a_square_fused_tensor_keeps_transformers_5_orientation():
    """2I = H: the fused gate/up tensor has one shape in both orientations, and
    transformers 5 reads it as its own; export writes it so (down_proj, I != H, the hub's)
    and import reads back the same experts."""
    from megatron_mm.families.qwen3_vl_moe.hf import ARCH, ARCHITECTURES

    layout = ARCHITECTURES[ARCH].layout
    layer = "model.language_model.layers.0.mlp."
    memory = {layer + "gate.weight": torch.randn(4, 8),
              layer + "experts.gate_up_proj": torch.randn(4, 8, 8),  # [E, 2I, H]
              layer + "experts.down_proj": torch.randn(4, 8, 4)}  # [E, H, I]
    experts = layout.normalise(memory)
    written = layout.written(experts, {"fused_experts": "hub"})
    assert torch.equal(written[layer + "experts.gate_up_proj"],
                       memory[layer + "experts.gate_up_proj"])
    assert torch.equal(written[layer + "experts.down_proj"],
                       memory[layer + "experts.down_proj"].transpose(1, 2))
    again = layout.normalise(written)
    assert again.keys() == experts.keys()
    assert all(torch.equal(again[k], v) for k, v in experts.items())

"""Transformer Engine layers on a GPU (docs/gpu.md), in bf16 (in fp32 TE runs neither its
flash nor its fused attention). Skipped without CUDA; on CUDA they FAIL where TE does not
import, unless MEGATRON_MM_GPU_TESTS_WITHOUT_TE=1 (``conftest.transformer_engine``).

- A TE model (LLM with a CLIP, SigLIP or Whisper-style encoder and its projector) takes a
  local model's weights through ``models/te_names.py`` (and only those, besides TE's
  module state) and computes the same loss.
- ``--media-attention bidirectional`` on TE (mask type ``arbitrary``) equals the local
  layers with the same mask, and differs from causal: TE does not drop the mask.
- A checkpoint saved with local specs loads into TE specs and back.
- M-RoPE (3-D positions) on TE equals the local layers.
- A packed row (``--data-balance``) on TE's THD varlen attention equals the local layers
  under the dense block-diagonal mask, with RoPE and M-RoPE.
- The Qwen2.5-VL tower on TE's THD varlen attention equals the local masks.
- A ViT whose class token makes its sequence odd, padded and masked with TE's ``padding``
  mask type (``--sequence-parallel``'s padding), equals the unpadded local ViT.
- TE picks its flash or fused attention (not unfused) for the causal and padding masks.
- An MoE LLM's local experts' checkpoint loads into TE's grouped GEMM and back.
"""

import dataclasses

import pytest
import torch

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig, ProjectorConfig
from megatron_mm.families.whisper.config import AudioEncoderConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models.te_names import is_module_state, to_te

pytestmark = pytest.mark.usefixtures("transformer_engine")
# TE's kernels against the local layers, both in bf16 (8 significant bits): a few roundings
# apart, not the O(1) of a dropped mask or a misplaced weight (tests/training/test_bf16.py).
LOSS_RTOL = 1e-2
TENSOR_RTOL = 5e-2  # ||x - x_ref|| / ||x_ref||, per tensor
FAST = {"flash", "fused"}


def assert_close_bf16(actual, expected, rtol=TENSOR_RTOL, msg=""):
    err, scale = (actual.float() - expected.float()).norm(), expected.float().norm()
    assert err <= rtol * scale + 1e-6, f"{msg} |diff| {err:.3g} vs |expected| {scale:.3g}"


MEDIA_ID = 250
ENCODERS = {  # each family's encoder; 16 media tokens per item
    "clip": VisionEncoderConfig(hidden_size=64, num_layers=2, num_attention_heads=4,
                                img_h=32, img_w=32, patch_dim=8, drop_class_token=True),
    "siglip": VisionEncoderConfig(model_type="siglip", hidden_size=64, num_layers=2,
                                  num_attention_heads=4, img_h=32, img_w=32, patch_dim=8),
    "whisper": AudioEncoderConfig(hidden_size=64, num_layers=2, num_attention_heads=4,
                                  num_mel_bins=16, max_source_positions=32, pool_stride=2),
}


def _config(kind, **language):
    name = "audio" if kind == "whisper" else "vision"
    return MultimodalModelConfig(
        encoders={name: ENCODERS[kind]},
        projectors={name: ProjectorConfig("affine" if kind == "whisper" else "mlp")},
        language=LanguageModelConfig(vocab_size=256, hidden_size=128, num_attention_heads=4,
                                     num_query_groups=2, qk_layernorm=True,
                                     add_qkv_bias=True, seq_length=64, **language))


def _build(impl, media_attention="causal", kind="clip", packed=False, **language):
    from megatron_mm.models import BuildSettings, build_model

    torch.manual_seed(0)
    settings = BuildSettings(transformer_impl=impl, media_attention=media_attention,
                             bf16=True, packed=packed)
    media = {"audio" if kind == "whisper" else "image": MEDIA_ID}
    # bf16 throughout, as Megatron's Float16Module casts a model (norms built in fp32 too)
    return build_model(_config(kind, **language), settings, media).cuda().bfloat16()


def _te_weights(local_state, te_model):
    state = {to_te(k): v for k, v in local_state.items() if not is_module_state(k)}
    state.update({k: v for k, v in te_model.state_dict().items() if is_module_state(k)})
    return state


def _batch(kind="clip"):
    g = torch.Generator().manual_seed(0)
    enc = ENCODERS[kind]
    tokens = torch.randint(0, 200, (2, 64), generator=g)
    tokens[:, 4:4 + enc.num_output_tokens] = MEDIA_ID
    labels = torch.randint(0, 200, (2, 64), generator=g)
    if kind == "whisper":
        media = {"audio": torch.randn(2, enc.num_mel_bins, enc.max_frames, generator=g),
                 "audio_frames": torch.tensor([enc.max_frames] * 2)}  # host-side lengths
    else:
        media = {"image": torch.randn(2, 3, 32, 32, generator=g)}
    pos = torch.arange(64).expand(2, -1)
    media = {k: v.cuda() if v.is_floating_point() else v for k, v in media.items()}
    return tokens.cuda(), pos.cuda(), media, labels.cuda()


def _loss(model, mask=None, kind="clip"):
    tokens, pos, media, labels = _batch(kind)
    return model(tokens, pos, media, labels=labels, attention_mask=mask)


def _bidirectional_mask(tokens):
    from megatron_mm.models.context_parallel import batch_codes, dense_mask

    codes = batch_codes(tokens, {MEDIA_ID: ENCODERS["clip"].num_output_tokens}, None,
                        "bidirectional")
    return dense_mask(codes, tokens.device)


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_te_model_takes_the_local_weights_and_computes_the_same(cuda_world, te_backends,
                                                                 kind):
    local, te = _build("local", kind=kind), _build("transformer_engine", kind=kind)
    local_names = {k for k in local.state_dict() if not is_module_state(k)}
    te_names = {k for k in te.state_dict() if not is_module_state(k)}
    assert te_names == {to_te(k) for k in local_names}
    te.load_state_dict(_te_weights(local.state_dict(), te), strict=True)
    torch.testing.assert_close(_loss(te, kind=kind), _loss(local, kind=kind),
                               rtol=LOSS_RTOL, atol=0)
    assert te_backends["causal"] and te_backends["causal"] <= FAST, te_backends


def test_te_applies_the_bidirectional_media_mask(cuda_world):
    local = _build("local")
    te = _build("transformer_engine", media_attention="bidirectional")
    te.load_state_dict(_te_weights(local.state_dict(), te), strict=True)
    mask = _bidirectional_mask(_batch()[0])
    bidirectional = _loss(te, mask)
    torch.testing.assert_close(bidirectional, _loss(local, mask), rtol=LOSS_RTOL, atol=0)
    causal = _loss(local)  # the same weights, text-style causal attention over media
    assert not torch.allclose(bidirectional, causal, rtol=LOSS_RTOL, atol=0)


def test_te_mrope_equals_local(cuda_world):
    """Megatron-Core's M-RoPE (unfused, [S, B] layout) on TE layers: 3-D positions that
    differ across the axes give the local layers' loss."""
    mrope = dict(position_embedding_type="mrope", mrope_section=(4, 6, 6))  # head dim 32
    local, te = _build("local", **mrope), _build("transformer_engine", **mrope)
    te.load_state_dict(_te_weights(local.state_dict(), te), strict=True)
    tokens, pos, media, labels = _batch()
    pos3 = torch.stack([pos, pos + tokens % 5, 2 * pos + 1])
    te_loss = te(tokens, pos3, media, labels=labels)
    torch.testing.assert_close(te_loss, local(tokens, pos3, media, labels=labels),
                               rtol=LOSS_RTOL, atol=0)


@pytest.mark.parametrize("mrope", [False, True], ids=["rope", "mrope"])
def test_te_thd_packed_row_equals_local_mask(cuda_world, mrope):
    """--data-balance on TE: a packed row (three samples, the image in the first) through
    TE's THD varlen attention (``PackedSequences`` from the host cu_seqlens) equals the
    local layers under the dense block-diagonal causal mask, with RoPE and M-RoPE."""
    from megatron_mm.models.packed_sequences import THDAttention
    from megatron_mm.training.assembly.attention import AttentionSettings

    language = dict(position_embedding_type="mrope", mrope_section=(4, 6, 6)) if mrope else {}
    local = _build("local", packed=True, **language)
    te = _build("transformer_engine", packed=True, **language)
    te.load_state_dict(_te_weights(local.state_dict(), te), strict=True)
    assert all(isinstance(layer.self_attention.core_attention, THDAttention)
               for layer in te.language_model.decoder.layers)
    tokens, _, media, labels = _batch()
    cu = [0, 24, 40, 64]
    pos = torch.cat([torch.arange(b - a) for a, b in zip(cu, cu[1:])])[None].cuda()
    if mrope:
        pos = torch.stack([pos, pos + tokens[:1] % 5, 2 * pos + 1])
    batch = {"tokens": tokens[:1].cpu(), "cu_seqlens": torch.tensor(cu, dtype=torch.int32)}
    dense = AttentionSettings({}).mask_for(batch, device="cuda")
    thd = AttentionSettings({}, packed_thd=True).mask_for(batch, device="cuda")
    image = {"image": media["image"][:1]}
    te_loss = te(tokens[:1], pos, image, labels=labels[:1], attention_mask=thd)
    torch.testing.assert_close(
        te_loss, local(tokens[:1], pos, image, labels=labels[:1], attention_mask=dense),
        rtol=LOSS_RTOL, atol=0)


def test_local_checkpoint_loads_into_te_and_back(cuda_world, tmp_path):
    from megatron_mm.training.checkpoint.checkpointing import load_checkpoint, save_checkpoint

    def args(path):
        from megatron_mm.training.cli.arguments import parse_run_config

        flags = ["--save", str(path), "--no-save-optim", "--no-save-rng", "--no-load-optim",
                 "--no-load-rng", "--micro-batch-size", "1"]
        config = parse_run_config(flags, world_size=1)  # --load: given here, not read
        return dataclasses.replace(
            config, model_config=_config("clip"),
            checkpoint=dataclasses.replace(config.checkpoint, load=str(path)))

    local = _build("local")
    save_checkpoint(args(tmp_path / "local"), 1, [local], None, None)
    te = _build("transformer_engine")
    load_checkpoint(args(tmp_path / "local"), [te], None, None)
    torch.testing.assert_close(_loss(te), _loss(local), rtol=LOSS_RTOL, atol=0)
    save_checkpoint(args(tmp_path / "te"), 1, [te], None, None)
    back = _build("local")
    torch.manual_seed(1)
    for p in back.parameters():
        torch.nn.init.normal_(p)
    load_checkpoint(args(tmp_path / "te"), [back], None, None)
    for name, value in local.state_dict().items():
        if torch.is_tensor(value) and not is_module_state(name):
            assert torch.equal(back.state_dict()[name], value), name


def test_qwen2_5_vl_tower_thd_equals_local(cuda_world, te_backends):
    """The Qwen2.5-VL tower on TE's THD varlen attention (window segments in window layers,
    frames in the full-attention layer) takes the local tower's weights and gives its
    tokens and gradients on two images of different sizes and a 2-frame video, reading no
    device value (the counter sets CUDA's sync debug mode to "error")."""
    from host_syncs import HostSyncCounter

    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
    from megatron_mm.families.qwen2_5_vl.vision import Qwen2_5VLVisionWithMerger
    from megatron_mm.families.qwen2_5_vl.transformer_config import (
        qwen2_5_vl_merger_transformer_config,
        qwen2_5_vl_vision_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = Qwen2_5VLVisionConfig(hidden_size=64, num_layers=2, num_attention_heads=4,
                                ffn_hidden_size=128, out_hidden_size=128, window_size=56,
                                fullatt_block_indexes=(1,))
    grids = [(1, 8, 12), (1, 4, 4), (2, 4, 8)]

    def build(impl):
        torch.manual_seed(0)
        s = BuildSettings(transformer_impl=impl, bf16=True)
        return Qwen2_5VLVisionWithMerger(qwen2_5_vl_vision_transformer_config(enc, s),
                                         qwen2_5_vl_merger_transformer_config(enc, s), enc,
                                         impl).cuda().bfloat16()

    local, te = build("local"), build("transformer_engine")
    te.load_state_dict(_te_weights(local.state_dict(), te), strict=True)
    g = torch.Generator().manual_seed(0)
    patches = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(patches, enc.patch_input_size, generator=g).cuda().bfloat16()
    weights = torch.randn(patches // 4, 128, generator=g).cuda().bfloat16()
    outs = {}
    for name, model in (("local", local), ("te", te)):
        batch = model.prepare(grids)  # host layout, copied to the device once
        counter = HostSyncCounter()
        with counter.active():
            out = model(pixels, batch)
            (out * weights).sum().backward()
        assert counter.found == [], name
        outs[name] = out
    assert_close_bf16(outs["te"], outs["local"], msg="tokens")
    local_grads = {to_te(k): p.grad for k, p in local.named_parameters()}
    for name, p in te.named_parameters():
        assert_close_bf16(p.grad, local_grads[name], msg=name)
    assert te_backends["padding"] and te_backends["padding"] <= FAST, te_backends


def test_padded_vit_on_te_equals_unpadded_local(cuda_world, te_backends):
    """CLIP's 16 patches + class token padded to 18 (what ``--sequence-parallel`` at TP=2
    does), the TE layers told ``padding`` with the [N, 1, 1, T] key mask: the unpadded
    local ViT's features and gradients, on TE's flash or fused kernel."""
    from megatron_mm.models.specs import get_layer_specs
    from megatron_mm.models.transformer_configs import BuildSettings
    from megatron_mm.families.vit.transformer_config import vision_transformer_config
    from megatron_mm.families.vit.model import VisionTransformer

    enc = VisionEncoderConfig(hidden_size=64, num_layers=2, num_attention_heads=4,
                              img_h=32, img_w=32, patch_dim=8)

    def build(impl, multiple):
        torch.manual_seed(0)
        specs = get_layer_specs(impl)
        config = vision_transformer_config(enc, BuildSettings(transformer_impl=impl,
                                                              bf16=True))
        return VisionTransformer(config, enc, specs.vision_layer, specs.vision_norm,
                                 sequence_multiple=multiple).cuda().bfloat16()

    local, te = build("local", 1), build("transformer_engine", 2)
    assert te.sp_padding == 1
    te.load_state_dict(_te_weights(local.state_dict(), te), strict=True)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(3, 3, 32, 32, generator=g).cuda()
    weights = torch.randn(3, 17, 64, generator=g).cuda().bfloat16()
    outs = {}
    for name, model in (("local", local), ("te", te)):
        outs[name] = model(images)
        (outs[name] * weights).sum().backward()
    assert_close_bf16(outs["te"], outs["local"], msg="features")
    local_grads = {to_te(k): p.grad for k, p in local.named_parameters()}
    for name, p in te.named_parameters():
        assert_close_bf16(p.grad, local_grads[name], msg=name)
    assert te_backends["padding"] and te_backends["padding"] <= FAST, te_backends


def _moe(grouped_gemm: bool):
    from megatron_mm.config import MoEConfig

    return MoEConfig(num_experts=4, ffn_hidden_size=64, router_topk=2, layer_freq=(1, 0),
                     token_dispatcher_type="alltoall", grouped_gemm=grouped_gemm)


def test_moe_local_experts_checkpoint_loads_into_grouped_gemm_and_back(cuda_world, tmp_path):
    """An MoE LLM (layer 0 MoE, layer 1 dense) saved with local experts (``SequentialMLP``)
    loads into TE's grouped GEMM (``TEGroupedMLP``, --moe-grouped-gemm) and computes the
    same loss; saved from there, it loads back into local experts bit for bit."""
    from megatron_mm.training.checkpoint.checkpointing import load_checkpoint, save_checkpoint

    def args(path, grouped):
        from megatron_mm.training.cli.arguments import parse_run_config

        flags = ["--save", str(path), "--no-save-optim", "--no-save-rng", "--no-load-optim",
                 "--no-load-rng", "--micro-batch-size", "1"]
        config = parse_run_config(flags, world_size=1)
        return dataclasses.replace(
            config, model_config=_config("clip", moe=_moe(grouped)),
            checkpoint=dataclasses.replace(config.checkpoint, load=str(path)))

    local = _build("local", moe=_moe(False))
    save_checkpoint(args(tmp_path / "local", False), 1, [local], None, None)
    te = _build("transformer_engine", moe=_moe(True))
    assert type(te.language_model.decoder.layers[0].mlp.experts).__name__ == "TEGroupedMLP"
    load_checkpoint(args(tmp_path / "local", True), [te], None, None)
    torch.testing.assert_close(_loss(te), _loss(local), rtol=LOSS_RTOL, atol=0)
    save_checkpoint(args(tmp_path / "te", True), 1, [te], None, None)
    back = _build("local", moe=_moe(False))
    torch.manual_seed(1)
    for p in back.parameters():
        torch.nn.init.normal_(p)
    load_checkpoint(args(tmp_path / "te", False), [back], None, None)
    for name, value in local.state_dict().items():
        if torch.is_tensor(value) and not is_module_state(name):
            assert torch.equal(back.state_dict()[name], value), name

"""FP8 in Transformer Engine's own layers (docs/gpu.md, "FP8, in more detail"): what the
CPU emulation checks, on TE's state. Skipped where TE or CUDA is missing; never run yet.

- An FP8 projector's run on zeros (a micro-batch without media) leaves its activations'
  scales alone and updates its weights' (``fp8_context.idle_run`` reads TE's
  ``fp8_meta["scaling_fwd"]`` layout: input, weight, output per GEMM).
- A frozen FP8 ViT updates its scales in training (TE updates only on leaving the
  outermost autocast with gradients enabled).
- Encoder pieces recomputed under TE FP8 go through TE's checkpoint: the gradients equal
  the run without recompute.
"""

import pytest
import torch

from megatron_mm.config import FreezeConfig, LanguageModelConfig, MultimodalModelConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models.specs import transformer_engine_available

pytestmark = pytest.mark.skipif(not transformer_engine_available(),
                                reason="needs Transformer Engine and a CUDA device")

MEDIA_ID = 250
SIGLIP = VisionEncoderConfig(model_type="siglip", hidden_size=64, num_layers=2,
                             num_attention_heads=4, img_h=32, img_w=32, patch_dim=8)


def _model(modules, frozen=(), **settings):
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.plan.fp8 import Fp8Settings

    torch.manual_seed(0)
    cfg = MultimodalModelConfig(
        encoders={"vision": SIGLIP},
        language=LanguageModelConfig(vocab_size=256, hidden_size=128, num_attention_heads=4,
                                     num_query_groups=2, seq_length=64),
        freeze=FreezeConfig(encoders=frozenset(frozen)))
    settings = BuildSettings(transformer_impl="transformer_engine",
                             fp8=Fp8Settings("hybrid", modules=tuple(modules)), **settings)
    model = build_model(cfg, settings, {"image": MEDIA_ID}).cuda()
    model.train()
    return model


def _scales(linear):
    return linear.fp8_meta["scaling_fwd"].scale.tolist()


def test_te_idle_projector_keeps_activation_scales(cuda_world):
    model = _model(["vision-projector"])
    fc1, fc2 = (model.vision_projection.encoder.linear_fc1,
                model.vision_projection.encoder.linear_fc2)
    with torch.no_grad():
        fc1.bias.fill_(1.0)  # zeros in, gelu(1) into fc2: not data
    text = torch.zeros(64, 2, 128, device="cuda", requires_grad=True)
    out = model._idle_projector("vision", text)
    for linear in (fc1, fc2):
        scales = _scales(linear)  # [input, weight, output] of its one GEMM
        assert scales[0] == 1.0 and scales[1] != 1.0, scales
    out.sum().backward()  # the idle run's backward (zero gradients) runs
    assert torch.equal(text.grad, torch.ones_like(text))


def test_te_frozen_fp8_vit_updates_its_scales(cuda_world):
    model = _model(["vision"], frozen=["vision"])
    images = torch.randn(2, 3, 32, 32, device="cuda")
    with torch.enable_grad():
        hidden = model.run_encoder("vision", {"image": images}, None)
    assert not hidden.requires_grad
    qkv = model.vision_model.decoder.layers[0].self_attention.linear_qkv
    assert any(s != 1.0 for s in _scales(qkv)), _scales(qkv)


def test_te_fp8_pieces_recompute_through_tes_checkpoint(cuda_world):
    plain = _model(["vision"])
    recomputed = _model(["vision"], recompute_granularity="full", recompute_method="uniform",
                        recompute_num_layers=1)
    recomputed.load_state_dict(plain.state_dict())
    images = torch.randn(2, 3, 32, 32, device="cuda")
    grads = []
    for model in (plain, recomputed):
        encoder = model.vision_model
        out = encoder.layers(encoder.embed(images), 0, 2)
        out.float().pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in encoder.named_parameters()
                      if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, msg=lambda m: f"{name}: {m}")

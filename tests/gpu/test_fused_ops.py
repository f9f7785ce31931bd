"""Megatron-LM's fusions on CUDA (``models/fusions.py``): those this machine's kernels allow
are on, and a model built with them computes what the plain ops compute, in bf16 (the
LLM's SwiGLU, SigLIP's tanh GELU on Megatron-Core's bias_gelu kernel, bias-dropout-add;
RoPE where TE imports). Needs CUDA, not Transformer Engine (local layers)."""

import dataclasses

import torch

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig, ProjectorConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models.fusions import Kernels, choose_fusions
from megatron_mm.training.config.fusion_args import FUSION_FLAGS

MEDIA_ID = 250


def _build(fusions=None):
    from megatron_mm.models import BuildSettings, build_model

    cfg = MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(model_type="siglip", hidden_size=64,
                                                num_layers=2, num_attention_heads=4,
                                                img_h=32, img_w=32, patch_dim=8)},
        projectors={"vision": ProjectorConfig("mlp")},
        language=LanguageModelConfig(vocab_size=256, hidden_size=128, num_attention_heads=4,
                                     num_query_groups=2, seq_length=64))
    torch.manual_seed(0)
    settings = BuildSettings(bf16=True, **({"fusions": fusions} if fusions else {}))
    # bf16 throughout, as Megatron's Float16Module casts a model (norms built in fp32 too)
    return build_model(cfg, settings, {"image": MEDIA_ID}).cuda().bfloat16()


def test_fused_model_equals_plain_ops(cuda_world):
    fusions = choose_fusions(dict.fromkeys(FUSION_FLAGS, True), Kernels.probe(), "local")
    assert fusions.bias_dropout and fusions.bias_swiglu and fusions.bias_gelu_tanh, fusions
    # no DDP here, so no main_grad for the fused weight-gradient accumulation
    fusions = dataclasses.replace(fusions, wgrad_megatron_linears=False)
    plain, fused = _build(), _build(fusions)
    fused.load_state_dict(plain.state_dict())
    llm, vit = fused.language_model.config, fused.vision_model.config
    assert llm.bias_activation_fusion and llm.bias_dropout_fusion
    assert vit.bias_activation_fusion and vit.activation_func is torch.nn.functional.gelu
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 200, (2, 64), generator=g)
    tokens[:, 4:20] = MEDIA_ID
    labels = torch.randint(0, 200, (2, 64), generator=g)
    images = torch.randn(2, 3, 32, 32, generator=g).cuda()
    pos = torch.arange(64).expand(2, -1).cuda()
    losses = {}
    for name, model in (("plain", plain), ("fused", fused)):
        loss = model(tokens.cuda(), pos, {"image": images}, labels=labels.cuda())
        loss.float().sum().backward()
        losses[name] = loss.float()
    torch.testing.assert_close(losses["fused"], losses["plain"], rtol=1e-2, atol=0)
    grads = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    for name, p in fused.named_parameters():
        if name in grads:
            err, scale = (p.grad.float() - grads[name].float()).norm(), grads[name].float().norm()
            assert err <= 5e-2 * scale + 1e-6, f"{name}: {err:.3g} vs {scale:.3g}"

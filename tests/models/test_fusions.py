"""Megatron-LM's fusions where their kernels exist: the choice on a faked CUDA machine
(which kernels import is an argument), the flags' names and meanings, and the CPU path
unchanged (every module's TransformerConfig as without fusions)."""

import dataclasses

import torch
import torch.nn.functional as F

from megatron_mm.config import LanguageModelConfig, ProjectorConfig
from megatron_mm.families.whisper.config import AudioEncoderConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models.fusions import Fusions, Kernels, choose_fusions, partial_tanh_gelu
from megatron_mm.training.cli.arguments import parse_run_config
from megatron_mm.training.config.fusion_args import FUSION_FLAGS, fusion_flags

ALL_ON = dict.fromkeys(FUSION_FLAGS, True)
CUDA_TE = Kernels(cuda=True, transformer_engine=True, fused_rope=True)
NGC = Kernels(cuda=True, transformer_engine=True, apex_wgrad=True, apex_softmax=True,
              fused_rope=True)
FUSED = ("bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion",
         "apply_rope_fusion", "gradient_accumulation_fusion", "persist_layer_norm")


def _configs(settings):
    """Every module's TransformerConfig (LLM, CLIP, SigLIP, Whisper-style, projector)."""
    from megatron_mm.models.transformer_configs import (language_transformer_config,
                                                        projector_transformer_config)
    from megatron_mm.families.whisper.transformer_config import audio_transformer_config
    from megatron_mm.families.vit.transformer_config import vision_transformer_config

    lm = LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4)
    vit = dict(hidden_size=32, num_layers=1, num_attention_heads=2, img_h=16, img_w=16,
               patch_dim=4)
    return {
        "llm": language_transformer_config(lm, settings),
        "clip": vision_transformer_config(VisionEncoderConfig(**vit), settings),
        "siglip": vision_transformer_config(VisionEncoderConfig(model_type="siglip", **vit),
                                            settings),
        "audio": audio_transformer_config(AudioEncoderConfig(
            hidden_size=32, num_layers=1, num_attention_heads=2, num_mel_bins=8,
            max_source_positions=8), settings),
        "projector": projector_transformer_config(ProjectorConfig(), lm, settings),
    }


def _fields(config):
    return {f: getattr(config, f) for f in FUSED + ("activation_func",)}


def test_megatron_lm_flags():
    """Megatron-LM's flags and dests: each fusion on unless its --no-*-fusion is given."""
    assert fusion_flags(parse_run_config([], world_size=1).fusion) == ALL_ON
    for dest, flag in FUSION_FLAGS.items():
        assert fusion_flags(parse_run_config([flag], world_size=1).fusion) == {
            **ALL_ON, dest: False}
    assert set(FUSION_FLAGS.values()) == {
        "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
        "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-gradient-accumulation-fusion"}


def test_cpu_path_unchanged():
    """Without CUDA every fusion is off, whatever the flags: each module's config is what
    it was before fusions existed (the plain ops, the module's own activation)."""
    from megatron.core.activations import quick_gelu

    from megatron_mm.models import BuildSettings
    from megatron_mm.training.assembly.build_settings import build_settings

    chosen = choose_fusions(ALL_ON, Kernels(), "local")
    assert chosen == Fusions() and "no CUDA" in chosen.describe()
    if not torch.cuda.is_available():
        assert build_settings(parse_run_config([], world_size=1)).fusions == Fusions()
    configs = _configs(BuildSettings(fusions=chosen))
    for name, config in configs.items():
        assert not any(getattr(config, f) for f in FUSED), name
    assert configs["llm"].activation_func is F.silu
    assert configs["clip"].activation_func is quick_gelu
    assert configs["siglip"].activation_func is partial_tanh_gelu
    assert configs["audio"].activation_func is F.gelu


def test_on_cuda_each_fusion_where_its_kernel_exists():
    """CUDA and TE, no Apex: bias-dropout and SwiGLU everywhere, RoPE in the LLM, SigLIP's
    tanh GELU on Megatron-Core's bias_gelu kernel; gradient-accumulation fusion only in
    modules of TE linears (the LLM holds Megatron-Core's output layer, which needs
    Apex's kernel); exact GELU (Whisper, the projector) and CLIP's quick_gelu unfused."""
    from megatron_mm.models import BuildSettings

    fusions = choose_fusions(ALL_ON, CUDA_TE, "transformer_engine")
    settings = BuildSettings(transformer_impl="transformer_engine", fusions=fusions)
    fields = {name: settings.common(stack) for name, stack in (
        ("llm", "llm"), ("vision", "vision"), ("projector", None))}
    fields = {name: {k: f[k] for k in ("bias_dropout_fusion", "masked_softmax_fusion",
                                       "apply_rope_fusion", "gradient_accumulation_fusion")}
              for name, f in fields.items()}
    assert not settings.common("llm", mrope=True)["apply_rope_fusion"]  # M-RoPE unfused
    assert fields["llm"] == dict(bias_dropout_fusion=True, masked_softmax_fusion=False,
                                 apply_rope_fusion=True, gradient_accumulation_fusion=False)
    assert fields["vision"] == dict(bias_dropout_fusion=True, masked_softmax_fusion=False,
                                    apply_rope_fusion=False, gradient_accumulation_fusion=True)
    assert fields["projector"]["gradient_accumulation_fusion"]
    assert settings.activation(F.silu, gated=True) == dict(activation_func=F.silu,
                                                           bias_activation_fusion=True)
    assert settings.activation(partial_tanh_gelu) == dict(activation_func=F.gelu,
                                                          bias_activation_fusion=True)
    assert settings.activation(F.gelu)["bias_activation_fusion"] is False
    from megatron.core.activations import quick_gelu
    assert settings.activation(quick_gelu)["bias_activation_fusion"] is False
    assert "fused_weight_gradient_mlp_cuda" in fusions.describe()
    # local layers on the same machine: no fused gradient accumulation at all
    local = choose_fusions(ALL_ON, CUDA_TE, "local")
    assert not local.wgrad_megatron_linears and not local.wgrad_te_linears
    # with Apex (an NGC container): every fusion Megatron-LM turns on
    ngc = choose_fusions(ALL_ON, NGC, "local")
    assert ngc.masked_softmax and ngc.wgrad_megatron_linears and ngc.rope


def test_no_te_no_rope_fusion_and_flags_turn_off():
    fusions = choose_fusions(ALL_ON, Kernels(cuda=True), "local")
    assert fusions.bias_dropout and fusions.bias_swiglu and not fusions.rope
    assert "rope off" in fusions.describe()
    off = choose_fusions({**ALL_ON, "bias_swiglu_fusion": False, "bias_dropout_fusion": False,
                          "gradient_accumulation_fusion": False}, NGC, "local")
    assert not (off.bias_swiglu or off.bias_dropout or off.wgrad_megatron_linears)
    assert off.bias_gelu_tanh and off.rope


def test_fp8_emulation_turns_gradient_accumulation_fusion_off():
    """The emulation quantises a copy of each weight, not the parameter holding main_grad
    (``fp8_emulation.emulate_linears`` refuses the fusion): it stays off, said why."""
    fusions = choose_fusions(ALL_ON, NGC, "local", fp8_emulation=True)
    assert not fusions.wgrad_megatron_linears and not fusions.wgrad_te_linears
    assert "--fp8-emulation" in fusions.describe()
    assert fusions.bias_dropout


def test_bias_gelu_kernel_is_tanh_gelu():
    """Why only tanh-GELU modules fuse: Megatron-Core's bias_gelu (eager body of the
    compiled kernel) is SigLIP's gelu_pytorch_tanh, not exact GELU."""
    from megatron.core.fusions.fused_bias_gelu import bias_gelu

    x, bias = torch.randn(64, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    kernel = bias_gelu._torchdynamo_orig_callable(bias, x)
    torch.testing.assert_close(kernel, partial_tanh_gelu(x + bias), rtol=1e-7, atol=1e-7)
    assert not torch.allclose(kernel, F.gelu(x + bias), rtol=1e-7, atol=1e-7)


def test_fused_configs_build():
    """The fields the CUDA choice gives are ones Megatron-Core's TransformerConfig takes
    (RoPE fusion left out: its check imports TE's fused RoPE, absent here)."""
    from megatron_mm.models import BuildSettings

    fusions = dataclasses.replace(choose_fusions(ALL_ON, NGC, "local"), rope=False)
    configs = _configs(BuildSettings(fusions=fusions))
    assert configs["llm"].bias_activation_fusion and configs["llm"].bias_dropout_fusion
    assert configs["siglip"].bias_activation_fusion
    assert configs["siglip"].activation_func is F.gelu
    assert not configs["clip"].bias_activation_fusion
    assert all(c.gradient_accumulation_fusion for c in configs.values())

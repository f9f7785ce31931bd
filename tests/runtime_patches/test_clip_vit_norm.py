"""Patch ``clip_vit_norm``: ``CLIPViTModel`` builds with its default norms without TE."""

import inspect

import torch
from megatron.core.models.vision.clip_vit_model import CLIPViTModel
from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
from megatron.core.transformer.torch_norm import WrappedTorchNorm


def test_upstream_fails(upstream):
    upstream.raised("clip_vit_build", "TypeError",
                    "LayerNorm.__init__() got an unexpected keyword argument 'config'",
                    where=("clip_vit_model.py", "self.ln_pre = build_module("))


def test_defaults_accept_config():
    params = inspect.signature(CLIPViTModel.__init__).parameters
    assert params["ln_pre_impl"].default is WrappedTorchNorm
    assert params["ln_post_impl"].default is WrappedTorchNorm


def test_builds_with_default_args_and_runs_forward(gloo_world, tiny_config):
    model = CLIPViTModel(tiny_config, get_vit_layer_with_local_spec())
    assert (model.img_h, model.img_w, model.patch_dim) == (336, 336, 14)
    assert model.seq_length == (336 // 14) ** 2 + 1  # patches + class token
    assert isinstance(model.ln_pre, torch.nn.LayerNorm)
    assert model.ln_pre.normalized_shape == (tiny_config.hidden_size,)
    assert model.ln_pre.eps == tiny_config.layernorm_epsilon

    calls = []
    model.ln_pre.register_forward_hook(lambda *args: calls.append(1))
    images = torch.randn(2, 3, 336, 336, generator=torch.Generator().manual_seed(0))
    out = model(images)
    assert out.shape == (2, model.seq_length, tiny_config.hidden_size)
    assert torch.isfinite(out).all() and calls == [1]
    out.square().mean().backward()
    assert model.ln_pre.weight.grad.abs().sum() > 0 and model.conv1.weight.grad is not None


def test_siglip_builds_with_default_post_norm(gloo_world, tiny_config):
    model = CLIPViTModel(tiny_config, get_vit_layer_with_local_spec(), model_subtype="siglip",
                         add_class_token=False, class_token_len=0, img_h=28, img_w=28)
    assert isinstance(model.ln_post, torch.nn.LayerNorm)
    out = model(torch.randn(1, 3, 28, 28))
    assert out.shape == (1, 4, tiny_config.hidden_size) and torch.isfinite(out).all()

"""The ViT's padded sequence (``--sequence-parallel`` pads patches + class token to a
multiple of TP): its layers declare the ``padding`` mask type, on the local spec as on
TE's, take the [N, 1, 1, T] key padding mask TE's ``padding`` type takes, and compute
what the unpadded ViT computes (features and gradients)."""

import pytest
import torch

from megatron_mm.families.vit.config import VisionEncoderConfig

# 16 patches + the class token: 17, padded to 18 (or 20)
ENC = VisionEncoderConfig(hidden_size=32, num_layers=2, num_attention_heads=2, img_h=16,
                          img_w=16, patch_dim=4)


def _vit(multiple, model_type="clip"):
    from megatron_mm.models import BuildSettings
    from megatron_mm.models.specs import get_layer_specs
    from megatron_mm.families.vit.transformer_config import vision_transformer_config
    from megatron_mm.families.vit.model import VisionTransformer

    torch.manual_seed(0)
    enc = VisionEncoderConfig(**{**ENC.__dict__, "model_type": model_type})
    specs = get_layer_specs("local")
    return VisionTransformer(vision_transformer_config(enc, BuildSettings()), enc,
                             specs.vision_layer, specs.vision_norm, sequence_multiple=multiple)


def _mask_types(vit):
    return {layer.self_attention.attn_mask_type for layer in vit.decoder.layers}


@pytest.mark.parametrize("multiple", [2, 5])
def test_padded_vit_equals_unpadded(gloo_world, multiple):
    from megatron.core.transformer.enums import AttnMaskType

    whole, padded = _vit(1), _vit(multiple)
    padded.load_state_dict(whole.state_dict())
    assert whole.sp_padding == 0 and padded.sp_padding == -17 % multiple
    assert _mask_types(whole) == {AttnMaskType.no_mask}
    assert _mask_types(padded) == {AttnMaskType.padding}
    images = torch.randn(3, 3, 16, 16)
    hidden = padded.embed(images)
    assert hidden.shape[0] == padded.layer_seq_length
    mask = padded.layer_inputs(hidden)["attention_mask"]
    assert mask.shape == (3, 1, 1, padded.layer_seq_length) and mask.dtype == torch.bool
    assert mask[:, 0, 0, 17:].all() and not mask[:, 0, 0, :17].any()
    weights = torch.randn(3, 17, 32)
    outs = {}
    for name, vit in (("whole", whole), ("padded", padded)):
        out = vit(images)
        (out * weights).sum().backward()
        outs[name] = out
    torch.testing.assert_close(outs["padded"], outs["whole"], rtol=1e-5, atol=1e-6)
    grads = dict(whole.named_parameters())
    for name, p in padded.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)


def test_unmasked_padding_would_differ(gloo_world):
    """The padding changes the result unless masked: what TE's ``no_mask`` would compute."""
    whole, padded = _vit(1), _vit(2)
    padded.load_state_dict(whole.state_dict())
    images = torch.randn(2, 3, 16, 16)
    x = padded.embed(images)
    unmasked = padded.features(padded.decoder(x, attention_mask=None))
    assert not torch.allclose(unmasked, whole(images), atol=1e-4)


def test_te_spec_declares_padding(te_placeholder_specs):
    """The TE ViT spec the padded ViT builds from declares ``padding`` (TE obeys the
    declared type: under Megatron-Core's ``no_mask`` it attends to the padding)."""
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_mm.models.te_attention_mask import padded_layer_spec

    te = te_placeholder_specs("transformer_engine").vision_layer
    mask_type = lambda s: s.submodules.self_attention.params["attn_mask_type"]  # noqa: E731
    assert mask_type(te) == AttnMaskType.no_mask
    assert mask_type(padded_layer_spec(te, 1)) == AttnMaskType.padding
    assert padded_layer_spec(te, 0) is te and mask_type(te) == AttnMaskType.no_mask
    core = padded_layer_spec(te, 1).submodules.self_attention.submodules.core_attention
    assert core is te.submodules.self_attention.submodules.core_attention

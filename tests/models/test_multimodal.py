"""The multimodal model on one rank: media merge, encoder variants, the sparse output
layer, and errors for batches whose placeholders do not match their media."""

import pytest
import torch

from megatron_mm.config import FreezeConfig, LanguageModelConfig, MultimodalModelConfig
from megatron_mm.families.vit.config import VisionEncoderConfig

IMAGE_ID = 250


def _build(**vision):
    from megatron_mm.models import BuildSettings, build_model

    enc = VisionEncoderConfig(hidden_size=32, num_layers=3, num_attention_heads=2, img_h=16,
                              img_w=16, patch_dim=4, **vision)
    cfg = MultimodalModelConfig(
        encoders={"vision": enc},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4,
                                     num_query_groups=2, qk_layernorm=True))
    return build_model(cfg, BuildSettings(), {"image": IMAGE_ID}), enc


def _batch(n_tokens, images_per_sample=(1, 2), seq=48):
    tokens = torch.randint(0, 200, (len(images_per_sample), seq))
    for b, n in enumerate(images_per_sample):
        tokens[b, 3:3 + n * n_tokens] = IMAGE_ID
    n_images = sum(images_per_sample)
    return tokens, torch.arange(seq).expand(len(images_per_sample), -1), torch.randn(
        n_images, 3, 16, 16)


@pytest.mark.parametrize("vision", [
    dict(model_type="clip"),
    dict(model_type="clip", drop_class_token=True, feature_layer=-2),
    dict(model_type="siglip", apply_post_layernorm=True),
])
def test_media_features_replace_placeholders(gloo_world, vision):
    model, enc = _build(**vision)
    assert len(model.vision_model.decoder.layers) == enc.num_layers_built
    assert (model.vision_model.class_token_len == 1) == (enc.model_type == "clip")
    tokens, pos, images = _batch(enc.num_output_tokens)
    merged = model.embed(tokens, pos, {"image": images})  # [S, B, H]
    features = model.encode("vision", images)  # [N, T, H]
    # Sample 0 holds image 0, sample 1 holds images 1 and 2, in order.
    t = enc.num_output_tokens
    torch.testing.assert_close(merged[3:3 + t, 0], features[0])
    torch.testing.assert_close(merged[3:3 + 2 * t, 1], features[1:3].reshape(2 * t, -1))
    text = model.language_model.embedding(input_ids=tokens, position_ids=pos)
    torch.testing.assert_close(merged[:3], text[:3])


def test_sparse_output_layer_equals_full_loss(gloo_world):
    model, enc = _build()
    tokens, pos, images = _batch(enc.num_output_tokens)
    labels = torch.randint(0, 200, tokens.shape)
    mask = torch.zeros(tokens.shape)
    mask[0, 30:33] = 1
    mask[1, 40:45] = 1
    full = model(tokens, pos, {"image": images}, labels=labels)
    sparse = model(tokens, pos, {"image": images}, labels=labels, loss_mask=mask)
    torch.testing.assert_close(sparse, full * mask, rtol=1e-6, atol=1e-6)
    (sparse.sum()).backward()
    assert model.vision_model.conv1.weight.grad.abs().sum() > 0


def test_placeholder_media_mismatch_is_an_error(gloo_world):
    from megatron_mm.models.multimodal import MediaMismatchError

    model, enc = _build()
    tokens, pos, images = _batch(enc.num_output_tokens)
    with pytest.raises(MediaMismatchError, match="but 2 image items"):
        model.embed(tokens, pos, {"image": images[:2]})  # three placeholder groups
    with pytest.raises(MediaMismatchError, match="but 0 image items"):
        model.embed(tokens, pos, {})


def test_config_validation_names_flags():
    from megatron_mm.config import ConfigError

    with pytest.raises(ConfigError, match="--vision-feature-layer 5"):
        VisionEncoderConfig(num_layers=2, feature_layer=5)
    with pytest.raises(ConfigError, match="--num-query-groups"):
        LanguageModelConfig(num_attention_heads=4, num_query_groups=3)
    with pytest.raises(ConfigError, match="not in the model"):
        MultimodalModelConfig(encoders={"vision": VisionEncoderConfig()},
                              freeze=FreezeConfig(encoders={"audio"}))

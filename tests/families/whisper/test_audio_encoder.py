"""The Whisper-style audio encoder as a second named encoder: variable-length clips fill
exactly their placeholders, next to images, and the config names its flags."""

import pytest
import torch

from megatron_mm.config import (ConfigError, FreezeConfig, LanguageModelConfig,
                                MultimodalModelConfig, ProjectorConfig)
from megatron_mm.families.whisper.config import AudioEncoderConfig
from megatron_mm.families.vit.config import VisionEncoderConfig

IMAGE_ID, AUDIO_ID = 250, 251


def _build(freeze=FreezeConfig()):
    from megatron_mm.models import BuildSettings, build_model

    vision = VisionEncoderConfig(hidden_size=32, num_layers=1, num_attention_heads=2, img_h=8,
                                 img_w=8, patch_dim=4)
    audio = AudioEncoderConfig(hidden_size=32, num_layers=2, num_attention_heads=2,
                               num_mel_bins=16, max_source_positions=12, pool_stride=2)
    cfg = MultimodalModelConfig(
        encoders={"vision": vision, "audio": audio},
        projectors={"audio": ProjectorConfig("affine")},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4),
        freeze=freeze)
    return build_model(cfg, BuildSettings(), {"image": IMAGE_ID, "audio": AUDIO_ID}), audio


def test_output_tokens_follow_the_clip_length():
    enc = AudioEncoderConfig(max_source_positions=50, pool_stride=2)
    assert enc.max_frames == 100 and enc.num_output_tokens == 25
    assert [enc.output_tokens(f) for f in (1, 4, 5, 99, 100)] == [1, 1, 1, 25, 25]


def test_clips_of_different_lengths_fill_their_placeholders(gloo_world):
    model, enc = _build()
    frames = torch.tensor([24, 9, 15])  # clip tokens: 6, 2, 4
    counts = [enc.output_tokens(int(f)) for f in frames]
    assert counts == [6, 2, 4]
    seq = 40
    tokens = torch.randint(0, 200, (2, seq))
    tokens[0, 1:6] = IMAGE_ID
    tokens[0, 10:16] = AUDIO_ID  # clip 0
    tokens[1, 2:4] = AUDIO_ID  # clip 1
    tokens[1, 20:24] = AUDIO_ID  # clip 2
    mels = torch.randn(3, enc.num_mel_bins, enc.max_frames)
    media = {"image": torch.randn(1, 3, 8, 8), "audio": mels, "audio_frames": frames}
    pos = torch.arange(seq).expand(2, -1)
    merged = model.embed(tokens, pos, media)
    features = model.encode("audio", mels)  # [3, 6, H]: padded length
    torch.testing.assert_close(merged[10:16, 0], features[0, :6])
    torch.testing.assert_close(merged[2:4, 1], features[1, :2])
    torch.testing.assert_close(merged[20:24, 1], features[2, :4])
    torch.testing.assert_close(merged[1:6, 0], model.encode("vision", media["image"])[0])
    # A clip's padding is silence the encoder sees, not other clips: its features are its own.
    alone = model.encode("audio", mels[1:2])
    torch.testing.assert_close(alone[0], features[1])


def test_frozen_audio_encoder_runs_no_backward(gloo_world):
    model, enc = _build(FreezeConfig(encoders={"audio"}))
    calls = {"fwd": 0, "bwd": 0}
    for layer in model.audio_model.decoder.layers:
        layer.register_forward_hook(lambda *_: calls.__setitem__("fwd", calls["fwd"] + 1))
        layer.register_full_backward_hook(
            lambda *_: calls.__setitem__("bwd", calls["bwd"] + 1))
    tokens = torch.randint(0, 200, (2, 24))
    tokens[0, 2:8] = AUDIO_ID
    tokens[1, 2:7] = IMAGE_ID
    media = {"image": torch.randn(1, 3, 8, 8),
             "audio": torch.randn(1, enc.num_mel_bins, enc.max_frames),
             "audio_frames": torch.tensor([24])}
    loss = model(tokens, torch.arange(24).expand(2, -1), media, labels=tokens)
    loss.sum().backward()
    assert calls == {"fwd": 2, "bwd": 0}  # autograd never enters the frozen encoder
    assert all(p.grad is None and not p.requires_grad
               for p in model.audio_model.parameters())
    assert all(p.grad is not None for p in model.audio_projection.parameters())
    assert model.vision_model.conv1.weight.grad is not None


def test_audio_placeholder_mismatch_is_an_error(gloo_world):
    from megatron_mm.models.multimodal import MediaMismatchError

    model, enc = _build()
    tokens = torch.randint(0, 200, (1, 20))
    tokens[0, 2:5] = AUDIO_ID
    media = {"audio": torch.randn(1, enc.num_mel_bins, enc.max_frames),
             "audio_frames": torch.tensor([24])}  # 6 tokens, not 3
    with pytest.raises(MediaMismatchError, match="3 audio placeholder tokens"):
        model.embed(tokens, torch.arange(20)[None], media)


def test_audio_config_names_flags():
    with pytest.raises(ConfigError, match="--audio-num-attention-heads"):
        AudioEncoderConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ConfigError, match="--audio-pool-stride"):
        AudioEncoderConfig(max_source_positions=2, pool_stride=4)

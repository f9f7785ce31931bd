"""The host-side ``BatchLayout`` (``models/batch_layout.py``): placeholder positions,
each clip's kept features and the loss positions, checked by hand; the placeholder
checks it raises; and the model's forward and backward with it read no device value
(images and variable-length audio, the sparse output layer)."""

import pytest
import torch
from host_syncs import count_during

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig, ProjectorConfig
from megatron_mm.families.whisper.config import AudioEncoderConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models.batch_layout import MediaMismatchError, batch_layout

IMAGE_ID, AUDIO_ID = 250, 251
IDS = {"image": IMAGE_ID, "audio": AUDIO_ID}


def _config():
    vision = VisionEncoderConfig(hidden_size=32, num_layers=1, num_attention_heads=2, img_h=8,
                                 img_w=8, patch_dim=4)  # 4 patches + class token
    audio = AudioEncoderConfig(hidden_size=32, num_layers=1, num_attention_heads=2,
                               num_mel_bins=16, max_source_positions=12, pool_stride=2)
    return MultimodalModelConfig(
        encoders={"vision": vision, "audio": audio},
        projectors={"audio": ProjectorConfig("affine")},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4))


def _batch():
    """2 x 16 tokens: sample 0 an image at 1-5 and a 6-token clip at 8-13, sample 1 a
    2-token clip at 2-3; loss on three tokens."""
    tokens = torch.arange(2 * 16).view(2, 16) % 200
    tokens[0, 1:6] = IMAGE_ID
    tokens[0, 8:14] = AUDIO_ID
    tokens[1, 2:4] = AUDIO_ID
    media = {"image": torch.randn(1, 3, 8, 8), "audio": torch.randn(2, 16, 24),
             "audio_frames": torch.tensor([24, 9])}  # 6 and 2 tokens
    loss_mask = torch.zeros(2, 16)
    loss_mask[0, 14] = loss_mask[1, 5] = loss_mask[1, 15] = 1
    return tokens, media, loss_mask


def test_layout_by_hand():
    tokens, media, loss_mask = _batch()
    layout = batch_layout(_config(), IDS, tokens, media, loss_mask)
    assert layout.items == {"vision": 1, "audio": 2}
    # flat [S, B] positions (s * B + b), in (sample, position) order
    assert layout.slots["vision"].tolist() == [2, 4, 6, 8, 10]
    assert layout.slots["audio"].tolist() == [16, 18, 20, 22, 24, 26, 5, 7]
    assert layout.keep["vision"] is None
    assert layout.keep["audio"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # 6 of clip 0, 2 of 1
    assert layout.loss_positions.tolist() == [11, 28, 31]  # (5, 1), (14, 0), (15, 1)


def test_mismatches_are_errors_on_the_host():
    tokens, media, _ = _batch()
    with pytest.raises(MediaMismatchError, match="5 image placeholder tokens but 0 image"):
        batch_layout(_config(), IDS, tokens, {k: v for k, v in media.items() if k != "image"})
    with pytest.raises(MediaMismatchError,
                       match=r"8 audio placeholder tokens but 2 audio items \(their lengths "
                             r"give 10 tokens\)"):
        batch_layout(_config(), IDS, tokens, {**media, "audio_frames": torch.tensor([24, 15])})
    with pytest.raises(MediaMismatchError, match=r"2 audio items but 1 lengths in media"):
        batch_layout(_config(), IDS, tokens, {**media, "audio_frames": torch.tensor([24])})


def test_forward_and_backward_with_a_host_layout_read_no_device_value(gloo_world):
    from megatron_mm.models import BuildSettings, build_model

    model = build_model(_config(), BuildSettings(), IDS)
    tokens, media, loss_mask = _batch()
    pos = torch.arange(16).expand(2, -1)
    labels = torch.randint(0, 200, tokens.shape)
    reference = model(tokens, pos, media, labels=labels, loss_mask=loss_mask)  # own layout
    layout = batch_layout(model.mm_config, IDS, tokens, media, loss_mask)

    def step():
        loss = model(tokens, pos, media, labels=labels, loss_mask=loss_mask, layout=layout)
        loss.sum().backward()
        return loss

    loss, counter = count_during(step)
    assert counter.found == []
    torch.testing.assert_close(loss, reference)
    assert model.audio_model.conv1.weight.grad.abs().sum() > 0
    assert model.vision_model.conv1.weight.grad.abs().sum() > 0

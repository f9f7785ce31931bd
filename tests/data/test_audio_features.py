"""Audio in the data path: Whisper log-mel features, per-clip placeholder expansion,
batches of clips of different lengths, and too-long clips refused naming the record."""

import json

import numpy as np
import pytest
import torch

from megatron_mm.data import DataRecordError, MultimodalDataset, collate
from megatron_mm.data.audio import AudioProcessorConfig, ClipTokenCount, log_mel
from megatron_mm.data.media import ImageProcessorConfig
from megatron_mm.data.spoken_digits import wav_bytes

CFG = AudioProcessorConfig(num_mel_bins=16, max_frames=40)  # 0.4 s


def _tokens_for_frames(frames):  # stride-2 conv, no pooling
    return (frames - 1) // 2 + 1


def _write(tmp_path, seconds):
    lines = []
    for i, s in enumerate(seconds):
        t = np.arange(int(s * 16000)) / 16000
        (tmp_path / f"{i}.wav").write_bytes(
            wav_bytes(np.rint(0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")))
        lines.append(json.dumps({"id": f"clip-{i}", "conversations": [
            {"from": "human", "value": "<audio>\nWhat tone?"}, {"from": "gpt", "value": "A"}],
            "audios": [f"{i}.wav"]}))
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _dataset(path, tok, cfg=CFG):
    counts = {"image": 4, "audio": ClipTokenCount(cfg, _tokens_for_frames)}
    return MultimodalDataset(path, tok, counts, ImageProcessorConfig(image_size=8),
                             audio_cfg=cfg)


@pytest.fixture(scope="module")
def tok():
    from megatron_mm.data import build_tokenizer

    return build_tokenizer()


def test_log_mel_matches_whisper_feature_extractor():
    transformers = pytest.importorskip("transformers")
    audio = (np.random.default_rng(0).standard_normal(5000) * 0.1).astype(np.float32)
    cfg = AudioProcessorConfig(num_mel_bins=80, max_frames=100)
    ref = transformers.WhisperFeatureExtractor(feature_size=80)(
        audio, sampling_rate=16000, padding="max_length", max_length=cfg.max_samples,
        return_tensors="np").input_features[0]
    torch.testing.assert_close(log_mel(audio, cfg), torch.from_numpy(ref), rtol=0, atol=1e-5)


def test_clips_of_different_lengths_in_one_batch(tmp_path, tok):
    ds = _dataset(_write(tmp_path, [0.1, 0.35]), tok)
    samples = [ds[0], ds[1]]
    audio_id = tok.media_token_id("audio")
    frames = [int(s.media["audio_frames"][0]) for s in samples]
    assert frames == [10, 35]  # 10 ms frames
    for s, f in zip(samples, frames):  # placeholders expand to the clip's own length
        assert int((s.tokens == audio_id).sum()) == _tokens_for_frames(f)
    batch = collate(samples, pad_id=tok.pad_id)
    assert batch["media"]["audio"].shape == (2, 16, 40)  # padded to the encoder's length
    assert batch["media"]["audio_frames"].tolist() == frames
    assert batch["media"]["image"].shape[0] == 0


def test_too_long_clip_is_refused_naming_the_record(tmp_path, tok):
    ds = _dataset(_write(tmp_path, [0.1, 0.5]), tok)
    ds[0]  # checked when read: the good clip loads
    with pytest.raises(DataRecordError, match=r"record 'clip-1' \(data.jsonl line 2\).*0\.50 s"
                                              r".*longer than the audio encoder takes "
                                              r"\(40 frames = 0\.40 s\).*--audio-max-source"):
        ds[1]


def test_audio_without_an_audio_encoder_is_an_error(tmp_path, tok):
    path = _write(tmp_path, [0.1])
    ds = MultimodalDataset(path, tok, {"audio": 3}, ImageProcessorConfig(image_size=8))
    with pytest.raises(DataRecordError, match="no audio encoder.*--audio-model-type"):
        ds[0]

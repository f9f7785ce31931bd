"""Audio clips (WAV file or inline base64 WAV) -> Whisper log-mel features, offline.

The features are those of Hugging Face's ``WhisperFeatureExtractor`` (16 kHz, 25 ms Hann
window, 10 ms hop, Slaney mel filters up to 8 kHz, log10 clamped to 8 below the maximum,
scaled as (x + 4) / 4), computed here with numpy / torch so no model download or
transformers install is needed. Each clip is zero-padded to the encoder's length first
(Whisper pads to 30 s), so its features do not depend on the other clips of a batch.
"""
from __future__ import annotations

import base64
import io
import wave
from dataclasses import dataclass
from functools import lru_cache
from math import gcd

import numpy as np
import torch

from .records import DataRecordError, MediaRef

WHISPER_SAMPLE_RATE = 16000


@dataclass(frozen=True)
class AudioProcessorConfig:
    num_mel_bins: int = 80
    max_frames: int = 3000  # the encoder's input length (2 x max source positions)
    sample_rate: int = WHISPER_SAMPLE_RATE
    n_fft: int = 400
    hop_length: int = 160
    max_flag: str = "--audio-max-source-positions"  # named when a clip is too long

    @property
    def max_samples(self) -> int:
        return self.max_frames * self.hop_length

    def frames(self, num_samples: int) -> int:
        """Mel frames a clip of ``num_samples`` (at ``sample_rate``) covers."""
        return max(1, -(-num_samples // self.hop_length))


def _wav_bytes(ref: MediaRef) -> bytes:
    if ref.path is not None:
        with open(ref.path, "rb") as f:
            return f.read()
    if ref.raw is not None:
        return ref.raw
    data = ref.data or ""
    if data.startswith("data:"):
        header, sep, data = data.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ValueError("only base64 data URIs are supported (data:audio/wav;base64,...)")
    return base64.b64decode(data, validate=True)


def _resampled_length(n: int, rate: int, target: int) -> int:
    """Length of scipy's ``resample_poly(x, up, down)`` output: ceil(n * up / down)."""
    g = gcd(rate, target)
    up, down = target // g, rate // g
    return -(-n * up // down)


def clip_samples(ref: MediaRef, cfg: AudioProcessorConfig, context: str = "") -> int:
    """Samples of a clip at ``cfg.sample_rate``, from the WAV header only (no decoding)."""
    try:
        with wave.open(io.BytesIO(_wav_bytes(ref))) as w:
            return _resampled_length(w.getnframes(), w.getframerate(), cfg.sample_rate)
    except (OSError, ValueError, EOFError, wave.Error) as e:
        raise DataRecordError(f"{context}: cannot read audio {ref.describe()}: {e}") from e


def load_audio(ref: MediaRef, cfg: AudioProcessorConfig, context: str = "") -> np.ndarray:
    """Mono float32 waveform in [-1, 1] at ``cfg.sample_rate`` (16-bit PCM WAV input)."""
    try:
        with wave.open(io.BytesIO(_wav_bytes(ref))) as w:
            if w.getsampwidth() != 2:
                raise ValueError(f"{8 * w.getsampwidth()}-bit samples; expected 16-bit PCM")
            rate, channels = w.getframerate(), w.getnchannels()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    except (OSError, ValueError, EOFError, wave.Error) as e:
        raise DataRecordError(f"{context}: cannot read audio {ref.describe()}: {e}") from e
    x = pcm.reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0
    if rate != cfg.sample_rate:
        from scipy.signal import resample_poly  # lazy: only for other sample rates

        g = gcd(rate, cfg.sample_rate)
        x = resample_poly(x, cfg.sample_rate // g, rate // g).astype(np.float32)
    return x


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = 3.0 * f / 200.0
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(f >= 1000.0, log_part, mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    hz = 200.0 * m / 3.0
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), hz)


@lru_cache(maxsize=8)
def mel_filters(num_mel_bins: int, n_fft: int, sample_rate: int) -> np.ndarray:
    """Slaney-normalised triangular filters [n_fft // 2 + 1, num_mel_bins] (librosa's)."""
    fft_freqs = np.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), num_mel_bins + 2)
    edges = _mel_to_hz(mels)
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def log_mel(audio: np.ndarray, cfg: AudioProcessorConfig) -> torch.Tensor:
    """[num_mel_bins, max_frames] float32 log-mel of ``audio`` zero-padded to max_frames."""
    x = torch.zeros(cfg.max_samples, dtype=torch.float32)
    x[:len(audio)] = torch.from_numpy(np.ascontiguousarray(audio[:cfg.max_samples]))
    stft = torch.stft(x, cfg.n_fft, cfg.hop_length, window=torch.hann_window(cfg.n_fft),
                      return_complex=True)
    power = stft[..., :-1].abs() ** 2  # [freq, frames]; the last frame is dropped
    filters = torch.from_numpy(mel_filters(cfg.num_mel_bins, cfg.n_fft, cfg.sample_rate))
    mel = filters.T.float() @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def audio_features(ref: MediaRef, cfg: AudioProcessorConfig, where: str
                   ) -> tuple[torch.Tensor, int]:
    """(log-mel [mel bins, max_frames], the clip's own frames); refuses a clip longer than
    the encoder takes, naming the record."""
    audio = load_audio(ref, cfg, where)
    check_clip_length(len(audio), cfg, ref, where)
    return log_mel(audio, cfg), cfg.frames(len(audio))


def check_clip_length(num_samples: int, cfg: AudioProcessorConfig, ref: MediaRef,
                      where: str) -> None:
    if num_samples > cfg.max_samples:
        raise DataRecordError(
            f"{where}: audio clip {ref.describe()} lasts {num_samples / cfg.sample_rate:.2f} s "
            f"({cfg.frames(num_samples)} mel frames), longer than the audio encoder takes "
            f"({cfg.max_frames} frames = {cfg.max_samples / cfg.sample_rate:.2f} s); raise "
            f"{cfg.max_flag} or cut the clip")


@dataclass(frozen=True)
class ClipTokenCount:
    """Placeholder tokens of one clip, from its WAV header (no decoding): the value of
    ``media_token_counts["audio"]``. ``tokens_for_frames`` is the encoder's rule
    (``AudioEncoderConfig.output_tokens``)."""

    cfg: AudioProcessorConfig
    tokens_for_frames: object  # Callable[[int], int]; picklable for DataLoader workers

    def __call__(self, ref: MediaRef, where: str) -> int:
        samples = clip_samples(ref, self.cfg, where)
        check_clip_length(samples, self.cfg, ref, where)
        return self.tokens_for_frames(self.cfg.frames(samples))

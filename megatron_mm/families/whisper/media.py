"""The Whisper family's media processor: log-mel clips padded to the encoder's frames."""

from __future__ import annotations

from ...data.audio import AudioProcessorConfig, ClipTokenCount
from ...data.media_processors import AudioProcessor


def audio_processor(model, enc) -> AudioProcessor:
    """The Whisper family's (``families/whisper/encoder.py``); the clips' shape is the
    encoder config's alone (``model``: the run's model group, unread)."""
    cfg = AudioProcessorConfig(num_mel_bins=enc.num_mel_bins, max_frames=enc.max_frames)
    return AudioProcessor(cfg, ClipTokenCount(cfg, enc.output_tokens))

"""The Whisper encoder's config (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...config import require


@dataclass
class AudioEncoderConfig:
    """A Whisper-style encoder: two 1-D convolutions over log-mel frames (the second with
    stride 2), sinusoidal positions, pre-norm transformer layers, a final norm, then an
    optional average pooling of frames (Qwen2-Audio pools by 2).

    Every clip is padded to ``max_frames`` mel frames, as Whisper pads to 30 s, so a clip's
    features do not depend on the batch it is in; only its first ``output_tokens(frames)``
    features reach the LLM.
    """

    model_type: str = "whisper"
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    ffn_hidden_size: Optional[int] = None
    num_mel_bins: int = 80
    max_source_positions: int = 100  # encoder frames after the stride-2 conv (Whisper: 1500)
    pool_stride: int = 1  # average pooling of encoder frames (Qwen2-Audio: 2)
    layernorm_epsilon: float = 1e-5
    flag_prefix: str = "--audio-"

    def __post_init__(self):
        p = self.flag_prefix
        require(self.model_type == "whisper",
                 f"{p}model-type must be whisper, got {self.model_type!r}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}hidden-size ({self.hidden_size}) must be divisible by "
                 f"{p}num-attention-heads ({self.num_attention_heads})")
        require(self.hidden_size % 2 == 0,
                 f"{p}hidden-size ({self.hidden_size}) must be even (sinusoidal positions)")
        require(self.num_layers >= 1, f"{p}num-layers must be at least 1")
        require(self.num_mel_bins >= 1, f"{p}num-mel-bins must be positive")
        require(self.pool_stride >= 1, f"{p}pool-stride must be at least 1")
        require(self.max_source_positions >= self.pool_stride,
                 f"{p}max-source-positions ({self.max_source_positions}) must be at least "
                 f"{p}pool-stride ({self.pool_stride})")

    @property
    def num_layers_built(self) -> int:
        return self.num_layers

    @property
    def max_frames(self) -> int:
        """Mel frames every clip is padded to (the longest clip the encoder takes)."""
        return 2 * self.max_source_positions

    @property
    def seq_length(self) -> int:
        return self.max_source_positions

    @property
    def num_output_tokens(self) -> int:
        """Features per clip out of the encoder (before dropping a clip's padding)."""
        return self.max_source_positions // self.pool_stride

    def output_tokens(self, frames: int) -> int:
        """Placeholder tokens of a clip of ``frames`` mel frames: the encoder frames its
        audio reaches (stride-2 conv), pooled; at least one."""
        encoder_frames = (frames - 1) // 2 + 1
        return max(1, min(encoder_frames // self.pool_stride, self.num_output_tokens))

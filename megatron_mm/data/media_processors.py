"""Media processors: a record's raw items of one modality -> the batch tensors its encoder
reads, and the exact placeholder count of every item. The fixed-size image and the audio
processors live here (the data pipeline's defaults); a family with its own names it in its
``EncoderFamily.media`` hook (``families/<name>/``).

``encode_record`` calls ``load`` with a record's items of the processor's modality (with
none, for the empty tensors every sample carries so that batches collate the same way);
``token_count`` is an int (every item alike) or ``f(ref, where)`` (from the item itself,
read cheaply: a WAV header, an image's size). A processor with ``position_ids(ids, media,
media_token_id, where)`` gives each sample its own [3, S] positions (M-RoPE). A family may
hand one processor per modality it reads (Qwen2.5-VL: images and videos).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .audio import AudioProcessorConfig, ClipTokenCount, audio_features
from .media import ImageProcessorConfig, load_image, preprocess_image
from .records import MediaRef


@dataclass
class ImageProcessor:
    """Fixed-size images (CLIP / SigLIP): resized and normalised, ``token_count`` each."""

    cfg: ImageProcessorConfig
    token_count: int
    modality: str = "image"

    def load(self, refs: list[MediaRef], where: str) -> dict[str, torch.Tensor]:
        size = self.cfg.image_size
        if not refs:
            return {"image": torch.empty(0, 3, size, size)}
        return {"image": torch.stack([preprocess_image(load_image(r, context=where), self.cfg)
                                      for r in refs])}


@dataclass
class AudioProcessor:
    """Whisper log-mel clips padded to the encoder's frames, with their true lengths."""

    cfg: AudioProcessorConfig
    token_count: ClipTokenCount
    modality: str = "audio"

    def load(self, refs: list[MediaRef], where: str) -> dict[str, torch.Tensor]:
        feats = [audio_features(r, self.cfg, where) for r in refs]
        mels = (torch.stack([m for m, _ in feats]) if feats
                else torch.empty(0, self.cfg.num_mel_bins, self.cfg.max_frames))
        return {"audio": mels,
                "audio_frames": torch.tensor([n for _, n in feats], dtype=torch.long)}

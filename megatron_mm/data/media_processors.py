"""Each encoder family's media processor: a record's raw items of one modality -> the
batch tensors its encoder reads, and the exact placeholder count of every item.

``encode_record`` calls ``load`` with a record's items of the processor's modality (with
none, for the empty tensors every sample carries so that batches collate the same way);
``token_count`` is an int (every item alike) or ``f(ref, where)`` (from the item itself,
read cheaply: a WAV header, an image's size).
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


def image_processor(args, enc) -> ImageProcessor:
    """The CLIP / SigLIP families' (``encoders/vit.py``): Hugging Face's
    preprocessor_config.json when ``--image-processor-config`` names one, else ``--img-h``
    with CLIP's statistics."""
    if getattr(args, "image_processor_config", None):
        from ..hf.image_processor import image_processor_from_hf

        cfg = image_processor_from_hf(args.image_processor_config)
    else:
        cfg = ImageProcessorConfig(image_size=args.img_h)
    return ImageProcessor(cfg, enc.num_output_tokens)


def audio_processor(args, enc) -> AudioProcessor:
    """The Whisper family's (``encoders/whisper.py``)."""
    cfg = AudioProcessorConfig(num_mel_bins=enc.num_mel_bins, max_frames=enc.max_frames)
    return AudioProcessor(cfg, ClipTokenCount(cfg, enc.output_tokens))

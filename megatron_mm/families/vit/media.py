"""The CLIP / SigLIP families' media processor: fixed-size images."""

from __future__ import annotations

from ...data.media import ImageProcessorConfig
from ...data.media_processors import ImageProcessor


def image_processor(model, enc) -> ImageProcessor:
    """The CLIP / SigLIP families' (``families/vit/encoder.py``; ``model``: the run's model
    group): Hugging Face's preprocessor_config.json when ``--image-processor-config`` names
    one, else ``--img-h`` with CLIP's statistics."""
    if model.image_processor_config:
        from ...hf.image_processor import image_processor_from_hf

        cfg = image_processor_from_hf(model.image_processor_config)
    else:
        cfg = ImageProcessorConfig(image_size=model.img_h)
    return ImageProcessor(cfg, enc.num_output_tokens)

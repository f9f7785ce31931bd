"""megatron_mm's preprocessing from a preprocessor_config.json equals the Hugging Face
image processor pixel for pixel (resize, center crop, rescale, normalise)."""

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_mm.data.media import preprocess_image
from megatron_mm.hf.image_processor import image_processor_from_hf


def _images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for h, w in ((37, 23), (20, 45), (16, 16))]


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_preprocessing_equals_the_hugging_face_processor(tmp_path, kind):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    hf = (CLIPImageProcessorPil(size={"shortest_edge": 20}, crop_size={"height": 16, "width": 16})
          if kind == "clip" else SiglipImageProcessorPil(size={"height": 16, "width": 16}))
    hf.save_pretrained(tmp_path)
    cfg = image_processor_from_hf(str(tmp_path / "preprocessor_config.json"))
    for image in _images():
        want = torch.from_numpy(np.asarray(hf(image, return_tensors="np")["pixel_values"][0]))
        got = preprocess_image(image, cfg)
        assert got.shape == want.shape == (3, 16, 16)
        assert torch.equal(got, want), (got - want).abs().max()


def test_unsupported_processor_is_named(tmp_path):
    from megatron_mm.hf.errors import ConversionError

    (tmp_path / "p.json").write_text('{"image_processor_type": "Qwen2VLImageProcessor"}')
    with pytest.raises(ConversionError, match="Qwen2VLImageProcessor.*supported: "
                                              "CLIPImageProcessor, SiglipImageProcessor"):
        image_processor_from_hf(str(tmp_path / "p.json"))

"""The data balancer's vision work of a Qwen3-VL image or video: its patches plus the
core attention within each whole frame, quadratic in the frame's patches (Qwen2.5-VL's
windows keep its work the patch count)."""

import pytest
from PIL import Image

from megatron_mm.data.records import MediaRef
from megatron_mm.families.encoder import encoder_transformer
from megatron_mm.plan.costs.flops import attention_pair_share
from megatron_mm.training.cli.arguments import parse_run_config

FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "256", "--max-position-embeddings", "256",
         "--vision-model-type", "qwen3_vl", "--vision-hidden-size", "32",
         "--vision-num-layers", "2", "--vision-num-attention-heads", "2",
         "--vision-ffn-hidden-size", "64", "--patch-dim", "16",
         "--vision-deepstack-visual-indexes", "0", "--vision-num-position-embeddings", "16",
         "--min-pixels", "1024", "--max-pixels", "65536",
         "--position-embedding-type", "mrope", "--mrope-section", "2", "3", "3"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    out = {}
    for side in (32, 256):
        path = root / f"{side}.png"
        Image.new("RGB", (side, side), (side % 256, 3, 7)).save(path)
        out[side] = MediaRef(path=str(path))
    return out


def test_vision_work_is_quadratic_in_each_frames_patches(images):
    from megatron_mm.families.qwen3_vl.media_processor import qwen3_vl_processor

    config = parse_run_config(FLAGS, world_size=1)
    enc = config.model_config.encoders["vision"]
    image, _ = qwen3_vl_processor(config.model, enc)
    share = attention_pair_share(encoder_transformer(enc, enc.num_layers))
    assert image.frame_attention == share > 0
    work = {}
    for side, ref in images.items():
        t, h, w = image.grid(ref, "r")
        assert (t, h, w) == (1, side // 16, side // 16)
        work[side] = image.vision_work(ref, "r")
        assert work[side] == round(h * w + share * (h * w) ** 2)
    # 64x the patches, more than 64x the work: 256 patches attend to each other
    assert work[256] / work[32] > 64 * 1.5
    linear = type(image)(image.cfg, tokens_per_second=1.0)  # Qwen2.5-VL's rule
    assert linear.vision_work(images[256], "r") == 256

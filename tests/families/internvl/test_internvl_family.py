"""The InternVL family on the encoder registry: torch-free registration, flags -> config
(checkpoint flags, refusals), the media processor's tile and token counts from image
headers, planner costs per tile, and --data-balance's vision work counted in tiles."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
from PIL import Image

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import CHECKPOINT_FLAGS, parse_args
from megatron_mm.training.cli.arguments import parse_run_config

FLAGS = ["--vision-model-type", "internvit", "--vision-hidden-size", "32",
         "--vision-num-layers", "2", "--vision-num-attention-heads", "2",
         "--img-h", "16", "--img-w", "16", "--patch-dim", "4", "--max-num-tiles", "4"]
# (width, height) -> tiles of 16 px with at most 4 and a thumbnail
SIZES = {(16, 16): 1, (32, 16): 3, (16, 48): 4, (32, 32): 5, (64, 16): 5}


@pytest.mark.processes
def test_registered_without_torch():
    code = ("import sys, megatron_mm.families as e\n"
            "assert e.family('internvit').config_class.__name__ == 'InternViTConfig'\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_flags_make_the_config():
    args = parse_args(FLAGS + ["--vision-qk-norm", "--vision-norm-type", "rms_norm",
                               "--no-use-thumbnail", "--downsample-ratio", "0.25",
                               "--vision-layerscale-init", "0.5"],
                      world_size=1)
    enc = args.model_config.encoders["vision"]
    assert (enc.model_type, enc.hidden_size, enc.image_size, enc.patch_size) == \
        ("internvit", 32, 16, 4)
    assert enc.qk_norm and enc.norm_type == "rms_norm" and not enc.use_thumbnail
    assert enc.layer_scale_init == 0.5
    assert enc.num_output_tokens == 1 and enc.seq_length == 17  # 4x4 patches, 4x4 shuffle
    assert enc.out_hidden_size == args.hidden_size
    for dest in ("vision_norm_type", "vision_qk_norm", "vision_add_qkv_bias",
                 "vision_final_layernorm", "downsample_ratio"):
        assert dest in CHECKPOINT_FLAGS
    assert "max_num_tiles" not in CHECKPOINT_FLAGS  # the data's choice, not the weights'


@pytest.mark.parametrize("extra, message", [
    (["--img-w", "32"], "internvit tiles are square: --img-w 32 must equal --img-h 16"),
    (["--min-num-tiles", "5"], "--min-num-tiles / --max-num-tiles: min_tiles (5) > max_tiles"),
    (["--downsample-ratio", "0.3"], "downsample_ratio 0.3 must be 1 / an integer"),
])
def test_bad_flags_are_refused(extra, message):
    from megatron_mm.training.cli.arguments import build_parser
    from megatron_mm.training.config.validation import validate_args

    args = build_parser().parse_args(FLAGS + extra)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_args(args, world_size=1)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    out = {}
    for w, h in SIZES:
        path = root / f"{w}x{h}.png"
        Image.new("RGB", (w, h), (w, h, 7)).save(path)
        out[w, h] = str(path)
    return out


def _processor():
    from megatron_mm.families.internvl.media import internvl_image_processor

    config = parse_run_config(FLAGS, world_size=1)
    return internvl_image_processor(config.model, config.model_config.encoders["vision"])


def test_processor_counts_tiles_from_the_header(images):
    from megatron_mm.data.records import MediaRef

    proc = _processor()
    refs = [MediaRef(path=images[size]) for size in SIZES]
    for ref, tiles in zip(refs, SIZES.values()):
        assert proc.vision_work(ref, "r") == tiles
        assert proc.token_count(ref, "r") == 4 * tiles  # 4 LLM tokens per 16 px tile
    batch = proc.load(refs, "record 'r'")["image"]
    assert tuple(batch.shape) == (sum(SIZES.values()), 3, 16, 16)
    assert tuple(proc.load([], "")["image"].shape) == (0, 3, 16, 16)


def test_planner_costs_per_tile():
    from megatron_mm.families.model_spec import model_spec

    config = parse_args(FLAGS, world_size=1).model_config
    config.language.vocab_size = 1000
    spec = model_spec(config, images_per_sample=5)
    (enc,) = spec.encoders
    assert (enc.items_per_sample, enc.tokens_per_item, enc.llm_tokens_per_item) == (5, 17, 4)
    assert enc.projector_input_size == 4 * 32 and spec.media_tokens_per_sample == 20


def test_data_balance_counts_tiles(images):
    from megatron_mm.data.records import parse_record
    from megatron_mm.data.tokenizer import build_tokenizer
    from megatron_mm.training.assembly.balanced_data import sample_loads

    proc = _processor()
    records = [parse_record({"id": f"r{i}", "text": "<image>" * len(group) + " digits",
                             "images": [images[s] for s in group]})
               for i, group in enumerate([[(16, 16)], [(32, 16), (64, 16)], [(16, 48)]])]
    dataset = SimpleNamespace(records=records, processors={"image": proc},
                              tokenizer=build_tokenizer(),
                              media_token_counts={"image": proc.token_count})
    loads = sample_loads(dataset)
    assert [load.vision for load in loads] == [1, 8, 4]

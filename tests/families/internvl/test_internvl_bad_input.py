"""InternVL's bad input stops the training script with one message naming the record or
the flag: a record whose images' tiles overflow --seq-length (with the --max-num-tiles that
would fit), a corrupt image, and a --max-num-tiles that no --seq-length image fits."""

import pytest
from bad_input_runs import conversation, good_records, run_entry, write_data
from internvl_data import INTERNVL_MODEL
from PIL import Image

# 16 px tiles, 4 LLM tokens each; --max-num-tiles 4 + thumbnail: at most 20 per image
MODEL = INTERNVL_MODEL + ["--num-layers", "1", "--hidden-size", "32",
                          "--num-attention-heads", "2", "--seq-length", "32"]


@pytest.mark.processes
def test_record_over_seq_length_names_it_and_the_tiles(tmp_path):
    Image.new("RGB", (64, 16), (10, 20, 30)).save(tmp_path / "wide.png")  # 4x1 + thumb
    data = write_data(tmp_path, [conversation("wide-2", "<image><image>\nSame?",
                                                ["wide.png", "wide.png"])] + good_records(7))
    out = run_entry(*MODEL, "--data-path", data)
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr
    assert "record 'wide-2'" in err and "exceed max_seq_length=32" in err, err[-2000:]
    assert "image 0 (64x16): 5 tiles, image 1 (64x16): 5 tiles" in err, err[-2000:]
    assert "with --max-num-tiles 4: lower --max-num-tiles to 1" in err, err[-2000:]
    assert "Traceback" not in err


@pytest.mark.processes
def test_corrupt_image_names_the_record_and_file(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    data = write_data(tmp_path, [conversation("r1", "<image>\nWhat?", ["broken.png"])]
                       + good_records(7))
    out = run_entry(*MODEL, "--data-path", data)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "record 'r1'" in out.stderr and "broken.png" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_max_num_tiles_that_no_image_fits_is_refused():
    from megatron_mm.config import ConfigError
    from megatron_mm.families.internvl.media import internvl_image_processor
    from megatron_mm.training.cli.arguments import parse_run_config

    config = parse_run_config(MODEL + ["--max-num-tiles", "12"], world_size=1)
    with pytest.raises(ConfigError, match="--max-num-tiles 12 lets one image take 13 tiles = "
                                          "52 tokens, more than --seq-length 32"):
        internvl_image_processor(config.model, config.model_config.encoders["vision"])

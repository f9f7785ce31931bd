"""InternVL tiling equals transformers bit for bit: tiles against ``GotOcr2ImageProcessorPil``
(the processor transformers builds without torchvision), the placeholder expansion against
``InternVLProcessor``'s text, built offline from a tiny word-level tokenizer. Bad records
are named."""

import json

import numpy as np
import pytest
import torch

from megatron_mm.families.internvl.media import (InternVLProcessorConfig, check_record_budget,
                                                 expand_image_placeholders, image_token_counter,
                                                 load_record_images, process_images, tile_image)
from megatron_mm.data.records import DataRecordError, parse_record
from megatron_mm.families.internvl.tiles import (IMAGENET_MEAN, IMAGENET_STD, InternVLTiling,
                                                 image_tokens, tile_count)
from media_files import random_image as _image

# (height, width): square, wide, tall, extreme, tiny, near-square large, grid-exact
SIZES = [(448, 448), (300, 900), (1000, 250), (37, 1500), (50, 60), (800, 801), (896, 1344)]


def _hf(tile=448, lo=1, hi=12, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import \
        GotOcr2ImageProcessorPil
    return GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True,
                                    min_patches=lo, max_patches=hi, image_mean=list(mean),
                                    image_std=list(std))


@pytest.mark.parametrize("max_tiles", [1, 4, 6, 12])
def test_tiles_equal_transformers_bit_for_bit(max_tiles):
    hf = _hf(hi=max_tiles)
    cfg = InternVLProcessorConfig(InternVLTiling(max_tiles=max_tiles))
    images = [_image(h, w, i) for i, (h, w) in enumerate(SIZES)]
    ref = hf(images=images, return_tensors="np")
    ours = process_images(images, cfg)
    assert ours.num_tiles == list(ref["num_patches"])
    assert ours.pixel_values.dtype == torch.float32
    assert np.array_equal(ours.pixel_values.numpy(), ref["pixel_values"])
    assert ours.image_tokens == [256 * n for n in ours.num_tiles]


def test_no_thumbnail_small_tiles_modes_and_arrays_equal_transformers():
    from transformers.image_utils import SizeDict
    hf = _hf(tile=224, lo=2, hi=6, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    for thumbnail in (True, False):
        cfg = InternVLProcessorConfig(InternVLTiling(tile_size=224, min_tiles=2, max_tiles=6,
                                                     use_thumbnail=thumbnail),
                                      mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
        for i, ((h, w), mode) in enumerate(zip(SIZES, ["RGB", "RGBA", "L"] * 3)):
            image = _image(h, w, 10 + i, mode)
            # transformers' own crop (use_thumbnail is a parameter there, not a setting),
            # then its rescale and normalise
            rgb = hf.process_image(image, do_convert_rgb=True)
            crops = hf.crop_image_to_patches(rgb, 2, 6, use_thumbnail=thumbnail,
                                             patch_size=SizeDict(height=224, width=224),
                                             resample=hf.resample)
            ref = np.stack([hf.normalize(hf.rescale(c, 1 / 255), [0.5] * 3, [0.5] * 3)
                            for c in crops])
            ours = tile_image(image, cfg)
            assert np.array_equal(ours, ref), (h, w, mode, thumbnail)
            if mode == "RGB":  # a uint8 array gives the same tiles as the PIL image
                assert np.array_equal(tile_image(np.asarray(image), cfg), ours)


def _internvl_processor(monkeypatch, image_seq_length, max_tiles):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    vocab = {"[UNK]": 0, "[PAD]": 5, "describe": 1, "and": 2, "compare": 3, "this": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                  extra_special_tokens={
                                      "start_image_token": "<img>",
                                      "end_image_token": "</img>",
                                      "context_image_token": "<IMG_CONTEXT>",
                                      "video_token": "<video>"})
    # The processor checks its tokenizer's class against a list that names
    # MistralCommonBackend, whose import needs packages this project does not install;
    # the check is all that is skipped, the expansion is transformers' own.
    monkeypatch.setattr(InternVLProcessor, "check_argument_for_proper_class",
                        lambda self, name, arg: type(arg))
    return InternVLProcessor(image_processor=_hf(hi=max_tiles), tokenizer=tok,
                             video_processor=None, image_seq_length=image_seq_length), tok


def test_placeholder_expansion_equals_internvl_processor(monkeypatch):
    # a tiny tokens-per-tile (tile 448, patch 112, no pixel shuffle: 4) keeps ids short
    tiling = InternVLTiling(max_tiles=6, patch_size=112, downsample_ratio=1.0)
    proc, tok = _internvl_processor(monkeypatch, tiling.tokens_per_tile, tiling.max_tiles)
    texts = ["describe <IMG_CONTEXT> and <IMG_CONTEXT> compare", "<IMG_CONTEXT> this"]
    images = [_image(300, 900, 1), _image(50, 60, 2), _image(1000, 250, 3)]
    ref = proc(images=images, text=texts, padding=True, return_tensors="np")
    cfg = InternVLProcessorConfig(tiling)
    ctx, start, end = (tok.context_image_token_id, tok.start_image_token_id,
                       tok.end_image_token_id)
    ours_pixels, k = [], 0
    for row, text in enumerate(texts):
        n = text.count("<IMG_CONTEXT>")
        media = process_images(images[k:k + n], cfg)
        k += n
        ours_pixels.append(media.pixel_values)
        ids = expand_image_placeholders(tok(text)["input_ids"], media.num_tiles, tiling,
                                        ctx, start, end)
        mask = ref["attention_mask"][row].astype(bool)  # left padding
        assert ids == ref["input_ids"][row][mask].tolist()
    assert np.array_equal(torch.cat(ours_pixels).numpy(), ref["pixel_values"])
    # 4 + 1 + 5 tiles here: the thumbnail only comes with a grid of several tiles
    assert [len(p) for p in ours_pixels] == [5, 5]
    # the processor's ids for one image of each size: 2 markers + tiles * tokens per tile,
    # and the tiles it cut (its pixel rows); public outputs only, no private helper
    sizes = [(h, w) for h, w in SIZES] + [(31 * k, 1000 - 29 * k) for k in range(1, 30)]
    ref = proc(images=[_image(h, w, i) for i, (h, w) in enumerate(sizes)],
               text=["<IMG_CONTEXT>"] * len(sizes), padding=True, return_tensors="np")
    tiles = [tile_count(h, w, tiling) for h, w in sizes]
    ids = [row[mask.astype(bool)].tolist()
           for row, mask in zip(ref["input_ids"], ref["attention_mask"])]
    assert [len(row) for row in ids] == [image_tokens(t, tiling) for t in tiles]
    assert [row.count(ctx) for row in ids] == [t * tiling.tokens_per_tile for t in tiles]
    assert len(ref["pixel_values"]) == sum(tiles)


def test_expansion_needs_one_placeholder_per_image():
    tiling = InternVLTiling()
    with pytest.raises(DataRecordError, match="record 'x': 1 image placeholders for 2 images"):
        expand_image_placeholders([5, 9], [1, 3], tiling, 9, 7, 8, "record 'x'")


def _record(tmp_path, rid, images):
    paths = []
    for i, im in enumerate(images):
        path = tmp_path / f"{rid}_{i}.png"
        if isinstance(im, bytes):
            path.write_bytes(im)
        else:
            im.save(path)
        paths.append(path.name)
    obj = {"id": rid, "conversations": [
        {"from": "human", "value": "<image>\n" * len(images) + "what is this?"},
        {"from": "gpt", "value": "a test"}], "images": paths}
    return parse_record(json.loads(json.dumps(obj)), source="data.jsonl line 4",
                        base_dir=str(tmp_path))


def test_record_images_tile_and_fit_the_budget(tmp_path):
    images = [_image(300, 900, 1), _image(448, 448, 2)]
    rec = _record(tmp_path, "two", images)
    cfg = InternVLProcessorConfig(InternVLTiling(max_tiles=6))
    media = load_record_images(rec, cfg)
    assert media.num_tiles == [4, 1]
    assert np.array_equal(media.pixel_values.numpy(), process_images(images, cfg).pixel_values)
    assert check_record_budget(rec, 40, 2048, cfg.tiling) == 40 + (4 * 256 + 2) + (256 + 2)
    count = image_token_counter(cfg.tiling)
    assert [count(ref, rec.where()) for ref in rec.media["image"]] == [1024, 256]


def test_too_many_tiles_for_the_sequence_length_names_the_record(tmp_path):
    rec = _record(tmp_path, "wide-page", [_image(1200, 1600, 3)])
    with pytest.raises(DataRecordError) as e:
        check_record_budget(rec, 40, 2048, InternVLTiling(max_tiles=12))
    msg = str(e.value)
    assert msg.startswith("record 'wide-page' (data.jsonl line 4): needs 3370 tokens")
    # at most 11 tiles, its 4:3 aspect takes the 3x2 grid (7 tiles with the thumbnail)
    assert "13 tiles" in msg and "lower --max-num-tiles to 11 or raise --seq-length" in msg
    assert check_record_budget(rec, 40, 2048, InternVLTiling(max_tiles=11)) == 40 + 7 * 256 + 2


def test_corrupt_image_names_the_record(tmp_path):
    png = tmp_path / "ok.png"
    _image(64, 64, 0).save(png)
    garbage = _record(tmp_path, "garbage", [_image(20, 20, 1), b"not an image at all"])
    for check in (lambda r: check_record_budget(r, 10, 100000, InternVLTiling()),
                  load_record_images):
        with pytest.raises(DataRecordError, match=r"record 'garbage' \(data.jsonl line 4\) "
                                                  r"image 1: cannot (decode|read) image "
                                                  r".*garbage_1.png"):
            check(garbage)
    # a valid header, then the file ends: the size is readable, the pixels are not
    truncated = _record(tmp_path, "truncated", [png.read_bytes()[:60]])
    assert check_record_budget(truncated, 10, 100000, InternVLTiling()) == 10 + 258
    with pytest.raises(DataRecordError, match=r"record 'truncated' \(data.jsonl line 4\) "
                                              r"image 0: cannot decode image"):
        load_record_images(truncated)

"""The Qwen2.5-VL demo's built-in data: deterministic, idempotent, held-out digits, images of
varying sizes and clips of 2 or 4 frames whose placeholders expand to the exact token
counts of the family's media processors under the demo's own flags (Makefile)."""
import json
import os
from collections import Counter

import numpy as np
import pytest
from makefile_flags import makefile_flags
from PIL import Image

from megatron_mm.families.qwen2_5_vl import digits as dq
from megatron_mm.data.digits import WORDS, load_digits_arrays, split_indices
from megatron_mm.data.media import load_image
from megatron_mm.data.processing import encode_record, tokenize_record
from megatron_mm.data.records import read_records

def demo_flags() -> list:
    return makefile_flags("DEMO_QWEN_FLAGS")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Fewer train records than the demo's (the same code draws them), to stay fast."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dq, "NUM_RECORDS", {"train": 60, "valid": dq.NUM_RECORDS["valid"]})
        out = tmp_path_factory.mktemp("digits_qwen")
        dq.prepare_digits_qwen(out)
        yield out


@pytest.fixture(scope="module")
def demo():
    """The demo's parsed flags, its tokenizer and its family's media processors."""
    from megatron_mm.data.tokenizer import build_tokenizer
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.data_setup import media_processors
    from megatron_mm.training.config.run_config import RunConfig

    args = parse_args(demo_flags(), world_size=2)
    return args, build_tokenizer(), media_processors(RunConfig.from_flags(args))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_deterministic_and_idempotent(data_dir):
    images, targets = load_digits_arrays()
    _, valid_pool = split_indices()
    again = [json.dumps(r, separators=(",", ":"))
             for r in dq.build_records("valid", images, targets, valid_pool)]
    assert (data_dir / "valid.jsonl").read_text().splitlines() == again
    train = data_dir / "train.jsonl"
    os.utime(train, ns=(1, 1))  # a rewrite would change the mtime
    assert dq.prepare_digits_qwen(data_dir) == (str(train), str(data_dir / "valid.jsonl"))
    assert os.stat(train).st_mtime_ns == 1
    before = train.read_bytes()
    with open(train, "ab") as f:  # corrupted: the manifest's hash no longer matches
        f.write(b"junk\n")
    dq.prepare_digits_qwen(data_dir)
    assert train.read_bytes() == before


def test_answers_held_out_digits_and_kinds(data_dir):
    images, targets = load_digits_arrays()
    train_pool, valid_pool = (set(p.tolist()) for p in split_indices())
    for split, pool in (("train", train_pool), ("valid", valid_pool)):
        recs = read_jsonl(data_dir / f"{split}.jsonl")
        assert len(recs) == dq.NUM_RECORDS[split]
        kinds = Counter()
        for r in recs:
            picks = r["sklearn_indices"]
            assert set(picks) <= pool and len(set(picks)) == len(picks)
            human, gpt = r["conversations"]
            assert gpt["value"] == " ".join(WORDS[targets[s]] for s in picks)
            if "videos" in r:
                (clip,) = r["videos"]
                assert human["value"] == "<video>\n" + dq.VIDEO_QUESTION
                assert len(clip["frames"]) == len(picks) and clip["fps"] == dq.VIDEO_FPS
                kinds["video", len(picks)] += 1
            else:
                assert human["value"] == "<image>" * len(picks) + "\n" + dq.IMAGE_QUESTION
                assert len(r["images"]) == len(picks)
                kinds["image", len(picks)] += 1
        assert set(kinds) == {(m, n) for m, n, _ in dq.KINDS}
        assert max(kinds.values()) - min(kinds.values()) <= 1  # the kinds take turns


def test_pixels_are_the_sklearn_digit_in_every_cell(data_dir):
    images, _ = load_digits_arrays()
    for split in ("train", "valid"):
        raw = read_jsonl(data_dir / f"{split}.jsonl")[:10]
        for obj, rec in zip(raw, read_records(data_dir / f"{split}.jsonl")[:10]):
            refs = (rec.media["image"] if "image" in rec.media
                    else rec.media["video"][0].frames)
            for s, ref in zip(obj["sklearn_indices"], refs):
                px = np.asarray(load_image(ref))[:, :, 0]
                h, w = px.shape
                cell = np.asarray(Image.fromarray(images[s]).resize((28, 28), Image.BILINEAR))
                assert np.array_equal(px, np.tile(cell, (h // 28, w // 28)))  # every cell


def test_placeholders_expand_to_exact_counts_under_the_demo_flags(data_dir, demo):
    """Sides stay as drawn (multiples of 28, within the demo's pixel bounds), so each item
    costs (t * h * w) / 4 LLM tokens of 14 px patches; every sample fits --seq-length."""
    args, tok, procs = demo
    counts = {m: p.token_count for m, p in procs.items()}
    image_id, video_id = tok.media_token_id("image"), tok.media_token_id("video")
    sizes, frames = set(), set()
    recs = read_records(data_dir / "valid.jsonl")
    for i, rec in enumerate(recs):
        expected = {"image": 0, "video": 0}
        for ref in rec.media.get("image", []):
            w, h = load_image(ref).size
            sizes.add((w, h))
            expected["image"] += (w // 28) * (h // 28)
        for clip in rec.media.get("video", []):
            w, h = load_image(clip.frames[0]).size
            frames.add(len(clip.frames))
            expected["video"] += len(clip.frames) // 2 * (w // 28) * (h // 28)
        ids = tokenize_record(rec, tok, counts).ids
        assert len(ids) <= args.seq_length, rec.id
        assert (ids.count(image_id), ids.count(video_id)) == (expected["image"],
                                                              expected["video"]), rec.id
        if i < 15:  # the pixels too: grids and M-RoPE positions agree with the counts
            sample = encode_record(rec, tok, counts, None, args.seq_length, processors=procs)
            assert sample.tokens.tolist() == ids
            grids = [*sample.media["image_grid_thw"].tolist(),
                     *sample.media["video_grid_thw"].tolist()]
            assert sum(t * h * w // 4 for t, h, w in grids) == sum(expected.values())
            assert sample.position_ids.shape == (3, len(ids))
    assert frames == {2, 4}
    assert {w for w, _ in sizes} == {h for _, h in sizes} == {c * dq.UNIT for c in dq.IMAGE_CELLS}
    assert any(w != h for w, h in sizes)  # aspect ratios vary

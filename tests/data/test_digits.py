"""Built-in sklearn digits dataset: split, labels, pixels, idempotency, CLI."""
import json
import os

import numpy as np
import pytest
from sklearn.datasets import load_digits

from megatron_mm.data.digits import WORDS, main, prepare_digits
from megatron_mm.data.media import load_image
from megatron_mm.data.records import read_records


@pytest.fixture(scope="module")
def sk():
    return load_digits()


@pytest.fixture(scope="module")
def inline_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    prepare_digits(out)
    return out


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_counts_split_and_labels(inline_dir, sk):
    train, valid = read_jsonl(inline_dir / "train.jsonl"), read_jsonl(inline_dir / "valid.jsonl")
    assert (len(train), len(valid)) == (1500, 297)
    src = [r["sklearn_index"] for r in train + valid]
    assert sorted(src) == list(range(1797))  # disjoint, and together the whole set
    # the split is pinned (seed 0)
    assert [r["sklearn_index"] for r in train[:3]] == [360, 1773, 1482]
    assert [r["sklearn_index"] for r in valid[:2]] == [1555, 1022]
    assert train[1]["id"] == "digits-train-00001" and valid[0]["id"] == "digits-valid-00000"
    for r in train + valid:
        target = int(sk.target[r["sklearn_index"]])
        human, gpt = r["conversations"]
        assert r["label"] == target and gpt == {"from": "gpt", "value": WORDS[target]}
        assert human["from"] == "human" and human["value"].startswith("<image>\n")
    assert WORDS[7] == "seven" and len(set(WORDS)) == 10
    assert len({r["conversations"][0]["value"] for r in train}) > 1  # questions vary


def test_images_decode_to_sklearn_pixels(inline_dir, sk):
    recs = read_records(inline_dir / "valid.jsonl") + read_records(inline_dir / "train.jsonl")[:200]
    raw = {r["id"]: r["sklearn_index"] for f in ("valid.jsonl", "train.jsonl")
           for r in read_jsonl(inline_dir / f)}
    for rec in recs:
        assert rec.media["image"][0].data.startswith("data:image/png;base64,")
        px = np.asarray(load_image(rec.media["image"][0]))[:, :, 0].astype(np.int64)
        values = sk.images[raw[rec.id]]
        assert px.shape == (8, 8)
        assert np.array_equal(px, np.rint(values * 255 / 16).astype(np.int64))
        assert np.array_equal(np.rint(px * 16 / 255), values)  # lossless back to 0..16


def test_prepare_is_idempotent(inline_dir):
    train = inline_dir / "train.jsonl"
    before = (os.stat(train).st_mtime_ns, train.read_bytes())
    os.utime(train, ns=(1, 1))  # a rewrite would change the mtime again
    assert prepare_digits(inline_dir) == (str(train), str(inline_dir / "valid.jsonl"))
    assert os.stat(train).st_mtime_ns == 1
    with open(train, "ab") as f:  # corrupt: content hash no longer matches -> rebuilt
        f.write(b"junk\n")
    prepare_digits(inline_dir)
    assert train.read_bytes() == before[1]


def test_cli_image_files(tmp_path, sk, capsys):
    main(["--out", str(tmp_path), "--image-files"])
    assert "train.jsonl" in capsys.readouterr().out
    first = read_jsonl(tmp_path / "train.jsonl")[0]
    assert first["images"] == ["images/digits-train-00000.png"]
    assert len(os.listdir(tmp_path / "images")) == 1797
    rec = read_records(tmp_path / "train.jsonl")[0]  # relative path resolves to the file
    assert rec.media["image"][0].path == str(tmp_path / "images" / "digits-train-00000.png")
    px = np.asarray(load_image(rec.media["image"][0]))[:, :, 0]
    assert np.array_equal(px, np.rint(sk.images[first["sklearn_index"]] * 255 / 16))

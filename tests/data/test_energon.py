"""JSONL -> Energon WebDataset conversion and Energon's loader: samples equal the JSONL
path's, data-parallel shards, exact resume from the saved loader state, bad records named
(skip vs fail), and a metadataset blend's mix following its weights."""
import base64
import io
import json
import multiprocessing
import os
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("megatron.energon")

from megatron_mm.data import collate  # noqa: E402
from megatron_mm.data.audio import AudioProcessorConfig, ClipTokenCount  # noqa: E402
from megatron_mm.data.energon import (  # noqa: E402
    blend_metadataset, read_records, train_batches, worker_config)
from megatron_mm.data.energon_convert import convert  # noqa: E402
from megatron_mm.data.loaders import EncodingSettings  # noqa: E402
from megatron_mm.data.media import ImageProcessorConfig  # noqa: E402
from megatron_mm.data.records import DataRecordError  # noqa: E402
from megatron_mm.data.spoken_digits import wav_bytes  # noqa: E402

AUDIO = AudioProcessorConfig(num_mel_bins=16, max_frames=40)


def _png(value) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (10, 6), (value, 255 - value, 7)).save(buf, format="PNG")
    return buf.getvalue()


def _record(i, base):
    """Images by path, inline (data URI and bare base64), audio, text records."""
    kind = i % 4
    q = {"from": "human", "value": "<image>\nWhat is it?"}
    a = {"from": "gpt", "value": f"answer {i}"}
    if kind == 0:
        return {"id": f"r{i}", "conversations": [q, a], "images": [f"img/{i % 3}.png"]}
    if kind == 1:
        uri = "data:image/png;base64," + base64.b64encode(_png(i)).decode()
        return {"id": f"r{i}", "text": f"<image> caption {i}", "images": [{"data": uri}]}
    if kind == 2:
        bare = base64.b64encode(_png(2 * i)).decode()
        return {"id": f"r{i}", "conversations": [
            {"from": "human", "value": "<image><image> two"}, a],
            "images": [{"data": bare}, os.path.join(base, "img", "1.png")]}
    q = {"from": "human", "value": "<audio>\nWhat did you hear?"}
    return {"id": f"r{i}", "conversations": [q, a], "audios": [f"wav/{i % 2}.wav"]}


def write_jsonl(directory, n, name="train.jsonl", start=0):
    os.makedirs(os.path.join(directory, "img"), exist_ok=True)
    os.makedirs(os.path.join(directory, "wav"), exist_ok=True)
    for k in range(3):
        with open(os.path.join(directory, "img", f"{k}.png"), "wb") as f:
            f.write(_png(40 * k))
    for k in range(2):
        t = np.arange(int((0.1 + 0.1 * k) * 16000)) / 16000
        with open(os.path.join(directory, "wav", f"{k}.wav"), "wb") as f:
            f.write(wav_bytes(np.rint(0.3 * np.sin(2 * np.pi * 440 * t) * 32767)
                              .astype("<i2")))
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        for i in range(start, start + n):
            f.write(json.dumps(_record(i, directory)) + "\n")
    return path


@pytest.fixture(scope="module")
def tok():
    from megatron_mm.data import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def encoding(tok):
    counts = {"image": 3, "audio": ClipTokenCount(AUDIO, lambda frames: (frames - 1) // 2 + 1)}
    return EncodingSettings(tok, counts, ImageProcessorConfig(image_size=8), 64, AUDIO)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("jsonl"))
    train = write_jsonl(src, 24)
    valid = write_jsonl(src, 4, "valid.jsonl", start=100)
    out = str(tmp_path_factory.mktemp("energon"))
    report = convert({"train": train, "valid": valid}, out, shard_size=5, log=lambda m: None)
    assert report.samples == {"train": 24, "valid": 4}
    return src, out


def _ids(batches, n):
    return [next(batches)["record_ids"] for _ in range(n)]


def test_conversion_writes_what_energon_prepare_writes(dataset):
    _, out = dataset
    meta = sorted(os.listdir(os.path.join(out, ".nv-meta")))
    assert {"dataset.yaml", "split.yaml", "index.sqlite"} <= set(meta)
    assert "CrudeWebdataset" in open(os.path.join(out, ".nv-meta", "dataset.yaml")).read()
    shards = sorted(f for f in os.listdir(out) if f.endswith(".tar"))
    assert shards == [f"train-{i:06d}.tar" for i in range(5)] + ["valid-000000.tar"]
    with tarfile.open(os.path.join(out, "train-000000.tar")) as t:
        names = t.getnames()
    assert names[:2] == ["000000000.json", "000000000.image0.png"]  # media as members


def test_energon_samples_equal_the_jsonl_path(dataset, encoding):
    src, out = dataset
    jsonl = encoding.dataset(os.path.join(src, "train.jsonl"))
    by_id = {jsonl.records[i].id: i for i in range(len(jsonl))}
    batches = train_batches(out, encoding.task_encoder(), worker_config(0, 1, 0, 7), 3)
    seen = set()
    for _ in range(8):
        batch = next(batches)
        ref = collate([jsonl[by_id[r]] for r in batch["record_ids"]], encoding.tokenizer.pad_id)
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert torch.equal(batch[key], ref[key]), key
        assert batch["media"].keys() == ref["media"].keys()
        for key in ref["media"]:
            assert torch.equal(batch["media"][key], ref["media"][key]), key
        seen.update(batch["record_ids"])
    assert len(seen) > 12  # records of all kinds (ids cycle through the four kinds)


def test_validation_split_reads_in_order(dataset):
    _, out = dataset
    records = read_records(out, "val")
    assert [r.id for r in records] == ["r100", "r101", "r102", "r103"]
    assert "from valid.jsonl line 1" in records[0].source


def test_data_parallel_ranks_read_disjoint_shares(dataset, encoding):
    _, out = dataset
    # Each rank reads its own slice of the shards, epoch after epoch (Energon's shuffle
    # buffer mixes neighbouring epochs, so a rank's first 12 samples need not be its 12).
    ranks = [set(sum(_ids(train_batches(out, encoding.task_encoder(),
                                        worker_config(r, 2, 0, 7), 2), 30), []))
             for r in range(2)]
    assert not ranks[0] & ranks[1]
    assert len(ranks[0]) == len(ranks[1]) == 12


@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.processes)])
def test_resume_from_saved_state_continues_with_the_same_samples(dataset, encoding,
                                                                 num_workers):
    _, out = dataset
    make = lambda state=None: train_batches(out, encoding.task_encoder(),  # noqa: E731
                                            worker_config(1, 2, num_workers, 7), 2, state)
    others = set(multiprocessing.active_children())  # started by earlier tests
    run = make()
    _ids(run, 3)  # mid-epoch: 6 of the rank's 12 samples
    state = run.save_state()
    expected = _ids(run, 8)  # into the next epoch
    resumed, fresh = make(state), make()
    assert _ids(resumed, 8) == expected
    assert _ids(fresh, 3) != expected[:3]  # a fresh loader starts over
    workers = set(multiprocessing.active_children()) - others
    assert len(workers) >= 3 * num_workers
    for batches in (run, resumed, fresh):
        batches.close()  # stops its worker processes here, not in a later test
    assert not workers & set(multiprocessing.active_children())


def _corrupt(out, member_suffix, data):
    """Replace a member's bytes in the first train shard (same size, index stays valid)."""
    path = os.path.join(out, "train-000000.tar")
    with tarfile.open(path) as t:
        member = next(m for m in t.getmembers() if m.name.endswith(member_suffix))
        offset, size = member.offset_data, member.size
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data[:size].ljust(size, b"\0"))


def test_bad_record_named_then_skipped_or_fatal(dataset, encoding, tmp_path, capsys):
    import shutil

    _, out = dataset
    bad = str(tmp_path / "bad")
    shutil.copytree(out, bad)
    _corrupt(bad, "000000000.image0.png", b"garbage")  # record r0's image
    with pytest.raises(DataRecordError, match=r"record 'r0' \(train-000000.tar sample "
                                              r"000000000, from train.jsonl line 1\): cannot "
                                              r"decode image 000000000.image0.png"):
        _ids(train_batches(bad, encoding.task_encoder(), worker_config(0, 1, 0, 7), 4), 6)
    encoding_skip = EncodingSettings(**{**encoding.__dict__, "bad_record_policy": "skip"})
    ids = sum(_ids(train_batches(bad, encoding_skip.task_encoder(),
                                 worker_config(0, 1, 0, 7), 4), 6), [])
    assert "r0" not in ids and len(ids) == 24  # batches stay full
    assert "skipping a bad record" in capsys.readouterr().out


def test_malformed_shard_sample_named_then_skipped_or_fatal(dataset, encoding, tmp_path,
                                                           capsys):
    import shutil

    _, out = dataset
    bad = str(tmp_path / "bad")
    shutil.copytree(out, bad)
    _corrupt(bad, "000000001.json", b"{not json")  # record r1's record
    with pytest.raises(DataRecordError, match=r"train-000000.tar sample 000000001: no valid "
                                              r"\.json member"):
        _ids(train_batches(bad, encoding.task_encoder(), worker_config(0, 1, 0, 7), 4), 6)
    encoding_skip = EncodingSettings(**{**encoding.__dict__, "bad_record_policy": "skip"})
    ids = sum(_ids(train_batches(bad, encoding_skip.task_encoder(),
                                 worker_config(0, 1, 0, 7), 4), 6), [])
    assert "r1" not in ids and len(ids) == 24
    assert "sample 000000001: no valid .json member" in capsys.readouterr().out


@pytest.mark.processes
def test_conversion_names_a_bad_record_skip_or_fail(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(_record(1, str(tmp_path))) + "\n"
                    + json.dumps({"id": "gone", "text": "<image>", "images": ["no.png"]}) + "\n")
    with pytest.raises(DataRecordError, match=r"record 'gone' \(train.jsonl line 2\): "
                                              r"images\[0\] file not found"):
        convert({"train": str(path)}, str(tmp_path / "a"))
    notes = []
    report = convert({"train": str(path)}, str(tmp_path / "b"), bad_record_policy="skip",
                     log=notes.append)
    assert report.samples == {"train": 1} and report.skipped == {"train": 1}
    assert "record 'gone'" in notes[0]


@pytest.mark.processes
def test_metadataset_blend_follows_its_weights(tmp_path_factory, encoding):
    dirs = []
    for name, start in (("a", 0), ("b", 1000)):
        src = str(tmp_path_factory.mktemp(f"src_{name}"))
        train = write_jsonl(src, 40, start=start)
        out = str(tmp_path_factory.mktemp(f"energon_{name}"))
        convert({"train": train}, out, shard_size=10, log=lambda m: None)
        dirs.append(out)
    encoding_text = EncodingSettings(**{**encoding.__dict__})
    meta = blend_metadataset(dirs, [0.75, 0.25])
    ids = sum(_ids(train_batches(meta, encoding_text.task_encoder(),
                                 worker_config(0, 1, 0, 3), 4), 100), [])
    share = sum(int(r[1:]) < 1000 for r in ids) / len(ids)
    # 400 draws at p=0.75: standard deviation 0.022; 4 sigma
    assert abs(share - 0.75) < 0.09, share


def test_packing_packs_what_the_jsonl_path_encodes_and_resumes(dataset, encoding):
    from megatron_mm.data.packing import collate_packed

    src, out = dataset
    jsonl = encoding.dataset(os.path.join(src, "train.jsonl"))
    by_id = {jsonl.records[i].id: i for i in range(len(jsonl))}
    make = lambda state=None: train_batches(  # noqa: E731
        out, encoding.task_encoder(packing_seq_length=64), worker_config(0, 1, 0, 7), 1,
        state, packing_buffer_size=8)
    run = make()
    for _ in range(4):
        batch = next(run)
        assert batch["tokens"].shape[1] <= 64 and len(batch["record_ids"]) >= 1
        ref = collate_packed([jsonl[by_id[r]] for r in batch["record_ids"]],
                             encoding.tokenizer.pad_id)
        for key in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens"):
            assert torch.equal(batch[key], ref[key]), key
    assert sum(len(next(run)["record_ids"]) for _ in range(4)) > 4  # samples do get packed
    state = run.save_state()
    expected = _ids(run, 4)
    assert _ids(make(state), 4) == expected


@pytest.mark.processes
def test_a_dataset_without_a_val_split_needs_valid_data_path(tmp_path, encoding):
    from megatron_mm.data.loaders import build_train_valid_datasets
    from megatron_mm.data.sources import DataConfigError, resolve_sources

    train = write_jsonl(str(tmp_path), 4)
    out = str(tmp_path / "energon")
    convert({"train": train}, out, log=lambda m: None)
    with pytest.raises(DataConfigError, match="has no 'val' split.*--valid-data-path"):
        build_train_valid_datasets(resolve_sources([out], None), encoding)
    train_data, valid = build_train_valid_datasets(resolve_sources([out], train), encoding)
    assert len(train_data) == 4 and len(valid) == 4

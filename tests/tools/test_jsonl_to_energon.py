"""tools/jsonl_to_energon.py: converts a directory of JSONL files; a bad record stops it
naming the record (exit 2), or is left out with --bad-record-policy skip."""

import json
import runpy
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

pytest.importorskip("megatron.energon")

TOOL = Path(__file__).resolve().parents[2] / "tools" / "jsonl_to_energon.py"


def _run(*argv):
    main = runpy.run_path(str(TOOL))["main"]
    return main(list(argv))


def _write(directory, records):
    directory.mkdir()
    (directory / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def _rec(rid, text="hello"):
    return {"id": rid, "text": text}


def test_converts_a_directory(tmp_path, capsys):
    src = _write(tmp_path / "src", [_rec(f"r{i}") for i in range(5)])
    (src / "valid.jsonl").write_text(json.dumps(_rec("v")) + "\n")
    assert _run("--input", str(src), "--output", str(tmp_path / "out"),
                "--shard-size", "2") == 0
    out = capsys.readouterr().out
    assert "train: 5 samples" in out and "valid: 1 samples" in out
    assert sorted(p.name for p in (tmp_path / "out").glob("*.tar")) == [
        "train-000000.tar", "train-000001.tar", "train-000002.tar", "valid-000000.tar"]


def test_bad_record_fails_or_is_left_out(tmp_path, capsys):
    src = _write(tmp_path / "src", [_rec("ok"), {"id": "bad", "text": "<image> x"}])
    assert _run("--train", str(src / "train.jsonl"), "--output", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err
    assert "record 'bad' (train.jsonl line 2) has 1 <image> placeholders but 0 images" in err
    assert _run("--train", str(src / "train.jsonl"), "--output", str(tmp_path / "b"),
                "--bad-record-policy", "skip") == 0
    assert "train: 1 samples, 1 bad records left out" in capsys.readouterr().out

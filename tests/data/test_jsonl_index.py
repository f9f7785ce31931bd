"""The lazy JSONL index (offsets, blank lines, line numbers) and bad records named when read,
skipped or fatal by --bad-record-policy."""
import io
import json

import pytest
from PIL import Image

from megatron_mm.data.dataset import MultimodalDataset
from megatron_mm.data.jsonl_index import JsonlRecords, scan_lines
from megatron_mm.data.media import ImageProcessorConfig
from megatron_mm.data.records import DataRecordError, read_records

CFG = ImageProcessorConfig(image_size=8)


def _png(value=100) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (8, 8), value).save(buf, format="PNG")
    return buf.getvalue()


def _conv(rid, images=()):
    return {"id": rid, "images": list(images),
            "conversations": [{"from": "human", "value": "<image>" * len(images) + " q"},
                              {"from": "gpt", "value": "seven"}]}


@pytest.fixture(scope="module")
def tok():
    from megatron_mm.data import build_tokenizer

    return build_tokenizer()


def test_scan_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    lines = [json.dumps(_conv("a")), "", "   ", json.dumps(_conv("b")), "\t",
             " " + json.dumps(_conv("c"))]  # leading space: still a record
    path = tmp_path / "d.jsonl"
    path.write_bytes(("\r\n".join(lines)).encode())  # CRLF, no final newline
    starts, lengths, line_numbers = scan_lines(str(path))
    assert line_numbers.tolist() == [1, 4, 6]
    records = JsonlRecords(path)
    assert [r.id for r in records] == ["a", "b", "c"]
    assert [r.id for r in records] == [r.id for r in read_records(path)]  # the eager reader
    assert records[1].source == "d.jsonl line 4" and records[-1].id == "c"


def test_scan_of_an_empty_file_and_a_final_newline(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    assert len(JsonlRecords(tmp_path / "e.jsonl")) == 0
    (tmp_path / "n.jsonl").write_text(json.dumps(_conv("a")) + "\n\n")
    assert len(JsonlRecords(tmp_path / "n.jsonl")) == 1
    (tmp_path / "f.jsonl").write_text(json.dumps(_conv("a")) + "\n" + json.dumps(_conv("b")))
    records = JsonlRecords(tmp_path / "f.jsonl")  # no blank line: no line-number array
    assert records.line_numbers is None and records[1].source == "f.jsonl line 2"


def test_records_are_checked_when_read_not_when_indexed(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps(_conv("ok", ["a.png"])), "{not json",
                               json.dumps(_conv("gone", ["missing.png"]))]) + "\n")
    records = JsonlRecords(path)  # indexing reads no record
    assert len(records) == 3 and records[0].id == "ok"
    with pytest.raises(DataRecordError, match=r"d.jsonl line 2: invalid JSON"):
        records[1]
    with pytest.raises(DataRecordError, match=r"record 'gone' \(d.jsonl line 3\): images\[0\] "
                                              r"file not found: .*missing.png"):
        records[2]


def _bad_data(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    (tmp_path / "broken.png").write_bytes(b"not a png")
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        _conv("r0", ["a.png"]), _conv("r1", ["broken.png"]), _conv("r2", ["missing.png"]),
        _conv("r3", ["a.png"])]) + "\n")
    return path


def test_fail_policy_names_the_bad_record(tmp_path, tok):
    ds = MultimodalDataset(_bad_data(tmp_path), tok, {"image": 2}, CFG)
    assert ds[0].record_id == "r0"
    with pytest.raises(DataRecordError, match=r"record 'r1' \(d.jsonl line 2\): cannot decode "
                                              r"image .*broken.png"):
        ds[1]


def test_skip_policy_names_the_record_and_reads_the_next(tmp_path, tok, capsys):
    ds = MultimodalDataset(_bad_data(tmp_path), tok, {"image": 2}, CFG,
                           bad_record_policy="skip")
    assert [ds[i].record_id for i in range(4)] == ["r0", "r3", "r3", "r3"]
    out = capsys.readouterr().out
    assert "skipping a bad record" in out and "record 'r1' (d.jsonl line 2)" in out
    assert "record 'r2' (d.jsonl line 3)" in out and "missing.png" in out


def test_skip_policy_gives_up_when_every_record_is_bad(tmp_path, tok):
    path = tmp_path / "d.jsonl"
    path.write_text("{bad\n" * 3)
    ds = MultimodalDataset(path, tok, {"image": 2}, CFG, bad_record_policy="skip")
    with pytest.raises(DataRecordError, match="3 bad records in a row"):
        ds[0]


@pytest.mark.processes
def test_dataset_reads_in_forked_workers(tmp_path, tok):
    from torch.utils.data import DataLoader

    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(_conv(f"r{i}")) for i in range(6)) + "\n")
    ds = MultimodalDataset(path, tok, {"image": 2}, CFG)
    ds[0]  # the parent opened its descriptor before the fork
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    assert [s.record_id for s in loader] == [f"r{i}" for i in range(6)]

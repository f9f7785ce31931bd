"""Bad JSONL data: found before the first iteration (every record checked, the ranks
sharing the work), one line by rank 0 naming file, line and field, every rank stopping
without a traceback; what only reading finds (an image that does not decode) still one
line and no traceback; ``tools/check_data.py`` lists every bad record."""

import importlib.util
import os

import pytest
from bad_input_runs import ROOT, conversation, good_records, run_ranks, write_data

WORLD = ["--micro-batch-size", "1", "--global-batch-size", "8"]


def _errors(outs):
    return [line for o in outs for line in o["stderr"].splitlines() if "error" in line]


@pytest.mark.processes
def test_bad_records_stop_every_rank_before_training(tmp_path):
    """Two bad records, the first on line 6 (a missing image), which rank 1's share of
    the check holds: rank 0 alone reports it, before iteration 1."""
    data = write_data(tmp_path, good_records(5)
                      + [conversation("bad-6", "<image>\nWhat?", ["nope.png"]),
                         {"id": "bad-7", "text": 3}] + good_records(2))
    outs = run_ranks(2, "--data-path", data, *WORLD)
    assert [o["returncode"] for o in outs] == [2, 2], outs
    errors = _errors(outs)
    assert len(errors) == 1 and errors[0] in outs[0]["stderr"], errors
    assert "train.jsonl line 6" in errors[0] and "images[0] file not found" in errors[0]
    assert "1 more bad records: python tools/check_data.py" in errors[0]
    assert not any("Traceback" in o["stderr"] for o in outs), outs[0]["stderr"][-3000:]
    assert not any(" iteration " in o["stdout"] for o in outs)


@pytest.mark.processes
def test_an_image_that_does_not_decode_is_one_line(tmp_path):
    """Found when read, by the one rank that reads it: one line, no traceback from the
    rank it left waiting."""
    (tmp_path / "garbage.png").write_bytes(b"not a png")
    data = write_data(tmp_path, good_records(5)
                      + [conversation("bad-6", "<image>\nWhat?", ["garbage.png"])]
                      + good_records(2))
    outs = run_ranks(2, "--data-path", data, *WORLD)
    assert all(o["returncode"] != 0 for o in outs), outs
    errors = _errors(outs)
    assert len(errors) == 1 and "record 'bad-6'" in errors[0], errors
    assert not any("Traceback" in o["stderr"] for o in outs), [o["stderr"][-3000:]
                                                              for o in outs]


def _check_data(capsys, *argv):
    """tools/check_data.py's exit status and output, run in this process."""
    spec = importlib.util.spec_from_file_location(
        "check_data", os.path.join(ROOT, "tools", "check_data.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    code = tool.main([str(a) for a in argv])
    return code, capsys.readouterr().out.splitlines()


def test_check_data_lists_every_bad_record(tmp_path, capsys):
    (tmp_path / "a.png").write_bytes(b"")
    data = write_data(tmp_path, [
        conversation("ok-1", "<image>\nWhat?", ["a.png"]),
        conversation("bad-2", "<image>\nWhat?", ["gone.png"]),
        {"id": "bad-3", "conversations": [{"from": "gpt", "value": "hi"}]},
    ] + good_records(2))
    with open(tmp_path / "train.jsonl", "a") as f:
        f.write("{not json\n")
    code, lines = _check_data(capsys, data)
    assert code == 1 and len(lines) == 4, lines
    assert "line 2" in lines[0] and "images[0] file not found" in lines[0]
    assert "line 3" in lines[1] and "conversations[0]" in lines[1]
    assert "line 6" in lines[2] and "invalid JSON" in lines[2]
    assert lines[3].startswith("3 bad of 7 records")
    code, lines = _check_data(capsys, tmp_path / "valid.jsonl")
    assert code == 0 and lines == [f"0 bad of 1 records in {tmp_path / 'valid.jsonl'}"]


class _BadRecords:
    def __len__(self):
        return 2

    def __getitem__(self, i):
        from megatron_mm.data.records import DataRecordError

        raise DataRecordError(f"record 'r{i}' (train.jsonl line {i + 1}): 'text' must be a "
                              f"string")


@pytest.mark.processes
def test_a_bad_record_read_by_a_loader_worker_is_one_line(capsys):
    """--num-workers 1: torch's DataLoader re-raises the worker's error with its traceback
    as the message; the report is the record's line alone."""
    from torch.utils.data import DataLoader

    from megatron_mm.data.records import DataRecordError
    from megatron_mm.training.cli.user_errors import report_user_error

    with pytest.raises(DataRecordError) as caught:
        next(iter(DataLoader(_BadRecords(), num_workers=1, batch_size=None)))
    assert "Traceback" in str(caught.value)
    report_user_error(str(caught.value), "pretrain_mllm.py")
    assert capsys.readouterr().err == ("pretrain_mllm.py: error: record 'r0' (train.jsonl "
                                       "line 1): 'text' must be a string\n")

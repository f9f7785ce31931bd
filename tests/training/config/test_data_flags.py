"""The data flags are checked up front and name what to fix."""

import json

import pytest

from megatron_mm.training.cli.arguments import parse_args


@pytest.fixture()
def data(tmp_path):
    jsonl = tmp_path / "d"
    jsonl.mkdir()
    for name in ("train.jsonl", "valid.jsonl"):
        (jsonl / name).write_text(json.dumps({"id": 1, "text": "x"}) + "\n")
    energon = tmp_path / "e"
    (energon / ".nv-meta").mkdir(parents=True)
    return str(jsonl), str(energon)


@pytest.mark.parametrize("argv, message", [
    (["--data-path", "0.5", "{jsonl}", "0.5"], "--data-path: a blend is weight-path pairs"),
    (["--data-path", "{jsonl}/missing.jsonl", "--valid-data-path", "{jsonl}/valid.jsonl"],
     "--data-path: {jsonl}/missing.jsonl does not exist"),
    (["--data-path", "1", "{jsonl}", "1", "{energon}"], "mixes JSONL and Energon"),
    (["--data-path", "{jsonl}", "--packing-buffer-size", "10", "--micro-batch-size", "1"],
     "--packing-buffer-size packs Energon data"),
    (["--data-path", "{energon}", "--packing-buffer-size", "10", "--micro-batch-size", "2",
      "--global-batch-size", "2"], "pass --micro-batch-size 1 (got 2)"),
    (["--data-path", "{energon}", "--data-balance", "isf"], "does not read Energon datasets"),
    (["--data-path", "{jsonl}", "--packing-seq-length", "8"], "needs --packing-buffer-size"),
    (["--data-path", "{jsonl}", "--bad-record-policy", "ignore"], "invalid choice: 'ignore'"),
])
def test_bad_data_flags_name_the_flag(capsys, data, argv, message):
    jsonl, energon = data
    argv = [a.format(jsonl=jsonl, energon=energon) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=1)
    assert exit_info.value.code == 2
    assert message.format(jsonl=jsonl) in capsys.readouterr().err


def test_good_data_flags(data):
    jsonl, energon = data
    args = parse_args(["--data-path", "0.7", jsonl, "0.3", jsonl,
                       "--bad-record-policy", "skip"], world_size=1)
    assert args.data_path == ["0.7", jsonl, "0.3", jsonl] and args.bad_record_policy == "skip"
    args = parse_args(["--data-path", energon, "--packing-buffer-size", "16",
                       "--micro-batch-size", "1"], world_size=1)
    assert args.packing_buffer_size == 16

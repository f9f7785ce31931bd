"""The training script run on bad data (each test's records in a temporary folder): what it
prints and how it exits, in a fresh interpreter or on a forked rank."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "pretrain_mllm.py")


def run_script(*argv):
    """The training script for one iteration on ``argv``, in a fresh interpreter."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, SCRIPT, "--train-iters", "1", *argv],
                          capture_output=True, text=True, env=env, timeout=300)


def run_entry(*argv):
    """``run_script``'s result (``returncode``, ``stdout``, ``stderr``): the script run as
    ``__main__`` on one rank forked from the harness's preloaded server
    (``tool_runs.run_tool``), without the interpreter's start-up and imports."""
    from tool_runs import run_tool

    return run_tool(SCRIPT, "--train-iters", "1", *argv, cwd=ROOT,
                    env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})


def write_data(tmp_path, train_records):
    """``train_records`` and one valid record as the jsonl files of ``tmp_path``."""
    valid = {"id": "v0", "conversations": [{"from": "human", "value": "hi"},
                                           {"from": "gpt", "value": "hello"}]}
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train_records)
    with open(tmp_path / "valid.jsonl", "w") as f:
        f.write(json.dumps(valid) + "\n")
    return str(tmp_path)


def conversation(rid, prompt, images):
    return {"id": rid, "images": images,
            "conversations": [{"from": "human", "value": prompt},
                              {"from": "gpt", "value": "seven"}]}


def good_records(n):  # records are checked when read: fill the first global batch (8)
    return [conversation(f"ok-{i}", "What digit?", []) for i in range(n)]


def script_rank(rank, argv):
    """The training script run as ``__main__`` on this harness rank, in its world (the
    launcher's environment kept): ``returncode``, ``stdout``, ``stderr``."""
    from tool_runs import HARNESS_ENV, run_as_main

    kept = {k: os.environ[k] for k in HARNESS_ENV if k in os.environ}
    return run_as_main(rank, SCRIPT, ["--train-iters", "1", *argv], ROOT, kept)


def run_ranks(world, *argv):
    """``script_rank``'s results on ``world`` ranks."""
    from dist_harness import run_distributed

    return run_distributed(script_rank, world, [str(a) for a in argv])

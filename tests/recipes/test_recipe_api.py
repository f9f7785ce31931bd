"""A run built in Python from a recipe in a few lines (two fields changed) trains, and the
same run from the command line (``--recipe demo`` plus the same two flags) gives the same
losses. One process each, 12 iterations of the demo."""

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What a user types; the last replace points the run at the test's data, skips the final
# evaluation and logs every iteration, on both sides.
API = """
from dataclasses import replace
from megatron_mm.startup import prepare_megatron_core; prepare_megatron_core()
from megatron_mm.recipes import demo
from megatron_mm.training.pretrain import pretrain
cfg = demo()
cfg = replace(cfg, training=replace(cfg.training, train_iters=12, lr=2e-3))
cfg = replace(cfg, data=replace(cfg.data, data_path=[{data!r}]),
              validation=replace(cfg.validation, skip_final_eval=True),
              logging=replace(cfg.logging, log_interval=1))
print("LOSSES", pretrain(cfg.validated())["losses"])
"""


def run(argv, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)  # one process, no torchrun: pretrain starts its own group
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.processes
def test_python_api_run_equals_the_command_line(digits_dir, tmp_path):
    out = run(["-c", API.format(data=str(digits_dir))], tmp_path)
    api = ast.literal_eval(out.split("LOSSES", 1)[1].strip())
    from tool_runs import run_tool

    cli_dir = tmp_path / "cli"
    cli_dir.mkdir()
    proc = run_tool(os.path.join(ROOT, "examples", "pretrain_mllm.py"), "--recipe", "demo",
                    "--train-iters", "12", "--lr", "2e-3", "--data-path", str(digits_dir),
                    "--skip-final-eval", "--log-interval", "1", cwd=cli_dir,
                    env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    cli = {int(it): float(loss) for it, loss in
           re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*? lm loss: (\S+) \|", out)}
    assert sorted(api) == sorted(cli) == list(range(1, 13))
    for it, loss in api.items():  # the command line prints 7 significant digits
        assert loss == pytest.approx(cli[it], rel=1e-6), it
    assert api[12] < api[1]

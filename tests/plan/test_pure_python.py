"""The planner and its CLI never import torch; the CLI works end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mm.plan import PipelinePlan

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "tools" / "plan.py"


def run(code):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_planner_imports_no_torch():
    proc = run("import sys, megatron_mm.plan, megatron_mm.reproductions.model_zoo\n"
               "import megatron_mm.reproductions.comparison\n"
               "assert 'torch' not in sys.modules, 'torch imported'\n"
               "assert not any(m.startswith('megatron.core') for m in sys.modules)")
    assert proc.returncode == 0, proc.stderr


def test_plan_imports_no_reproduction():
    """Every plan module imports, without torch and without the paper reproductions above it."""
    proc = run("import importlib, pkgutil, sys, megatron_mm.plan as plan\n"
               "for m in pkgutil.walk_packages(plan.__path__, 'megatron_mm.plan.'):\n"
               "    importlib.import_module(m.name)\n"
               "assert 'torch' not in sys.modules, 'torch imported'\n"
               "assert 'megatron_mm.reproductions' not in sys.modules, 'reproductions imported'")
    assert proc.returncode == 0, proc.stderr


def test_plan_tool_imports_no_torch():
    proc = run("import importlib.util, sys\n"
               f"spec = importlib.util.spec_from_file_location('plan_tool', {str(PLAN)!r})\n"
               "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
               "mod.build_parser()\n"
               "assert 'torch' not in sys.modules, 'torch imported'")
    assert proc.returncode == 0, proc.stderr


def cli(*args):
    return subprocess.run([sys.executable, str(PLAN), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_cornstarch_table():
    proc = cli("--cornstarch-table")
    assert proc.returncode == 0, proc.stderr
    rows = [l.split("|")[1:-1] for l in proc.stdout.splitlines() if l.startswith("| ")]
    rows = [[c.strip() for c in r] for r in rows if r[0].strip() not in ("pair", "---")]
    assert [r[0] for r in rows] == ["VLM-L", "ALM-L", "VALM-L", "VLM-M", "ALM-M", "VALM-M",
                                    "VLM-S", "ALM-S", "VALM-S"]
    for r in rows:
        uniform, aware = float(r[5]), float(r[7])
        # VPP 1, no p2p cost: the min-max optimum can never lose to the uniform layout
        assert aware <= uniform and r[8] == f"{uniform / aware:.2f}x"


def test_single_plan_json_and_errors(tmp_path):
    out = tmp_path / "plan.json"
    proc = cli("--model-pair", "VLM-S", "--freeze-ViT", "--freeze-LM", "--num-microbatches",
               "8", "--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
               "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "| uniform |" in proc.stdout and "| auto |" in proc.stdout
    plan = PipelinePlan.from_dict(json.loads(out.read_text()))
    assert plan.partition.policy == "auto" and plan.estimate.num_microbatches == 8

    proc = cli("--model-pair", "VLM-S", "--pipeline-partition", "10,50,3")
    assert proc.returncode == 2 and "lists 3 stages, but PP x VPP = 4 x 1 = 4" in proc.stderr
    proc = cli("--model-pair", "VLM-S", "--pipeline-partition", "fast")
    assert proc.returncode == 2 and "auto, uniform, balanced" in proc.stderr
    proc = cli("--model-pair", "VLM-L", "--freeze-ViT", "--freeze-LM", "--memory-limit-gb",
               "10")
    assert proc.returncode == 2 and "memory limit of 10 GiB" in proc.stderr
    proc = cli("--num-layers", "4")
    assert proc.returncode == 2 and "missing --hidden-size" in proc.stderr


def test_sizes_on_the_command_line():
    proc = cli("--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "8",
               "--vocab-size", "32000", "--swiglu", "--vision-num-layers", "6",
               "--vision-hidden-size", "512", "--vision-num-attention-heads", "8",
               "--freeze-ViT", "--freeze-LM", "--pipeline-model-parallel-size", "2",
               "--pipeline-partition", "uniform", "--seq-length", "1024")
    assert proc.returncode == 0, proc.stderr
    assert "llm[embedding] vision[embed, 0-5, projector] llm[0-3]" in proc.stdout

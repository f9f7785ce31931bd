"""A tool run on a forked rank (``tool_runs.run_tool``) fails, as in a fresh interpreter,
when it imports Megatron-Core or a package that needs it before its
``prepare_megatron_core()`` call, and runs when it calls it first."""

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

PREPARE = "from megatron_mm.startup import prepare_megatron_core\nprepare_megatron_core()\n"
IMPORTS = ["import megatron.core", "from megatron_mm import training",
           "from megatron_mm.models import multimodal"]


@pytest.mark.parametrize("imports", IMPORTS)
def test_an_import_before_preparing_fails_the_tool(tmp_path, imports):
    late = tmp_path / "late.py"
    late.write_text(f"{imports}\n{PREPARE}")
    failed = run_tool(late, cwd=tmp_path)
    assert failed.returncode == 1
    assert "before calling megatron_mm.startup.prepare_megatron_core()" in failed.stderr


def test_the_same_imports_after_preparing_run(tmp_path):
    first = tmp_path / "first.py"
    first.write_text(PREPARE + "\n".join(IMPORTS) + "\nprint('ran')\n")
    ran = run_tool(first, cwd=tmp_path)
    assert (ran.returncode, ran.stdout.strip()) == (0, "ran"), ran.stderr

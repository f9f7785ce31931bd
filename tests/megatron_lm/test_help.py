"""``--help`` of a Megatron-LM script with the package's flags (the example and a user's
own script, ``user_pretrain_vlm.py``) prints Megatron-LM's flags and the package's group,
and exits 0 (before: Megatron-Core 0.19.2's "10%" help text stopped it with
``ValueError: unsupported format character ')'``; patches/0008)."""

import os

import pytest
from megatron_lm_runs import ROOT, SCRIPT, USER_SCRIPT
from tool_runs import run_tool

pytestmark = [pytest.mark.processes, pytest.mark.slow]


@pytest.mark.parametrize("script", [SCRIPT, USER_SCRIPT], ids=os.path.basename)
def test_help_lists_the_package_flags(script):
    out = run_tool(script, "--help", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    for words in ("megatron_mm (multimodal", "--vision-model-type", "--encoder-schedule",
                  "--pipeline-partition", "--tensor-model-parallel-size", "10%"):
        assert words in out.stdout, words

"""The CPU patches go in by the entry point's explicit first call, never as a side effect of
an import: in a fresh interpreter, importing a package that imports Megatron-Core before
``prepare_megatron_core()`` applies nothing and stops with an error naming the call."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import sys
from megatron_mm.patches import applied_patches
try:
    __import__(sys.argv[1])
except RuntimeError as e:
    print("ERROR", e)
print("APPLIED", applied_patches(), "megatron.core" in sys.modules)
"""


@pytest.mark.processes
@pytest.mark.parametrize("package", ["megatron_mm.models", "megatron_mm.training",
                                     "megatron_mm.runtime", "megatron_mm.hf"])
def test_import_before_prepare_applies_nothing_and_names_the_call(package):
    out = subprocess.run([sys.executable, "-c", PROBE, package], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "APPLIED [] False" in out.stdout, out.stdout  # nothing patched, nothing imported
    assert "call megatron_mm.startup.prepare_megatron_core() first" in out.stdout, out.stdout

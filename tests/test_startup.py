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
from megatron_mm.runtime_patches import applied_patches
try:
    __import__(sys.argv[1])
except RuntimeError as e:
    print("ERROR", e)
print("APPLIED", applied_patches(), "megatron.core" in sys.modules)
"""


def probe(package: str) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, package], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "APPLIED [] False" in out.stdout, out.stdout  # nothing patched, nothing imported
    return out.stdout


@pytest.mark.processes
@pytest.mark.parametrize("package", ["megatron_mm.models", "megatron_mm.training",
                                     "megatron_mm.runtime", "megatron_mm.hf.convert"])
def test_import_before_prepare_applies_nothing_and_names_the_call(package):
    assert "call megatron_mm.startup.prepare_megatron_core() first" in probe(package)


@pytest.mark.processes
@pytest.mark.parametrize("package", ["megatron_mm.hf", "megatron_mm.families"])
def test_registry_and_converter_package_import_without_megatron_core(package):
    """The architecture lookup and the family registry load before any preparation (the
    planner and the argument parser read them): no Megatron-Core, so no error."""
    assert "ERROR" not in probe(package)

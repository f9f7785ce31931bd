"""A Transformer Engine whose import fails in a way Megatron-Core does not survive (an
extension built against another torch: an undefined symbol) stops an entry
point's first call (``prepare_megatron_core``) with TE's error and what to do (reinstall it,
or uninstall it to train with ``--transformer-impl local``), rather than Megatron-Core's bare
traceback. In a fresh interpreter: the broken TE must be found before Megatron-Core is
imported."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[1]
TE_ERROR = ("transformer_engine_torch.cpython-312-x86_64-linux-gnu.so: undefined symbol: "
            "_ZN3c104cuda9SetDeviceEab")
PREPARE = "from megatron_mm.startup import prepare_megatron_core; prepare_megatron_core()"


def test_broken_te_stops_the_import_with_its_error_and_the_way_out(tmp_path):
    pkg = tmp_path / "transformer_engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"raise ImportError({TE_ERROR!r})\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", PREPARE], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: Transformer Engine is installed but does not "
                           "import: ImportError: " + TE_ERROR), last
    assert "--transformer-impl local" in last and "--no-build-isolation" in last, last

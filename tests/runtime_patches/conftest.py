"""Shared fixtures for the tests of the CPU patches (``megatron_mm.runtime_patches``).

* All patches are applied to this process (``tests/conftest.py``, as an entry point does), so each
  test runs the real megatron-core code path with its patch in place.
* ``upstream``: what megatron-core does *without* the patches, measured in one fresh
  subprocess (``_upstream_probe.py``) per session.
* ``registry_under_cuda``: ``apply_cpu_patches()`` in a fresh subprocess whose
  ``torch.cuda.device_count`` answers 1 (and ``is_available`` True).
* ``gloo_world`` (from ``tests/conftest.py``): a 1-rank gloo world, TP=PP=1, per module.

Both subprocesses start in ``pytest_configure``, before this process imports megatron-core,
so that they run alongside the tests (importing megatron-core costs several seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SUBPROCESS_TIMEOUT_S = 600

# apply_cpu_patches() on a faked CUDA machine (NVML's device count, which the registry asks,
# and is_available); reports what changed.
_REGISTRY_UNDER_CUDA = r"""
import json, sys
import torch
names = ("current_device", "current_stream", "synchronize")
before = {n: getattr(torch.cuda, n) for n in names}
before_tensor = {n: getattr(torch.Tensor, n) for n in ("cuda", "type")}
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
from megatron_mm.runtime_patches import apply_cpu_patches, applied_patches
from megatron_mm.runtime_patches.triton_stub import TARGET
returned = apply_cpu_patches()
again = apply_cpu_patches()
result = {
    "returned": returned,
    "again": again,
    "applied": applied_patches(),
    "torch_cuda_unchanged": {n: getattr(torch.cuda, n) is f for n, f in before.items()},
    "torch_tensor_unchanged": {n: getattr(torch.Tensor, n) is f
                               for n, f in before_tensor.items()},
    "patch_modules_imported": sorted(m for m in sys.modules
                                     if m.startswith("megatron_mm.runtime_patches.")),
    "megatron_core_imported": "megatron.core" in sys.modules,
    "stub_installed": getattr(sys.modules.get(TARGET), "__megatron_mm_stub__", False),
}
print("REGISTRY-RESULTS " + json.dumps(result))
"""

_BACKGROUND: dict[str, "_Background"] = {}
_APPLY_ERROR: list[BaseException] = []


class _Background:
    """A subprocess started early; ``result()`` waits for it and parses its result line."""

    def __init__(self, argv: list[str], marker: str):
        self.marker = marker
        self.argv = argv
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self.out, stderr=self.err,
                                     text=True)
        self._result = None

    def result(self) -> dict:
        if self._result is None:
            try:
                self.proc.wait(timeout=SUBPROCESS_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.stop()
                pytest.fail(f"{self.argv[1:]} did not finish in {SUBPROCESS_TIMEOUT_S}s")
            self.out.seek(0)
            self.err.seek(0)
            out, err = self.out.read(), self.err.read()
            lines = [l for l in out.splitlines() if l.startswith(self.marker + " ")]
            if self.proc.returncode != 0 or not lines:
                pytest.fail(f"subprocess {self.argv[1:2]} failed (rc={self.proc.returncode}):\n"
                            f"{out[-3000:]}\n{err[-6000:]}")
            self._result = json.loads(lines[-1][len(self.marker) + 1:])
        return self._result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_configure(config):
    if config.option.collectonly or _cuda_available():
        return
    if not _BACKGROUND:
        _BACKGROUND["upstream"] = _Background(
            [sys.executable, str(HERE / "_upstream_probe.py")], "PROBE-RESULTS")
        _BACKGROUND["registry"] = _Background(
            [sys.executable, "-c", _REGISTRY_UNDER_CUDA], "REGISTRY-RESULTS")
    from megatron_mm.runtime_patches import apply_cpu_patches

    try:
        apply_cpu_patches()
    except Exception as exc:  # reported by every test here, without ending the whole session
        _APPLY_ERROR.append(exc)


def pytest_unconfigure(config):
    for job in _BACKGROUND.values():
        job.stop()


def pytest_collection_modifyitems(config, items):
    if not _cuda_available():
        return
    skip = pytest.mark.skip(reason="the CPU patches are only for machines without CUDA")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _patches_applied():
    if _APPLY_ERROR:
        pytest.fail(f"apply_cpu_patches() failed: {_APPLY_ERROR[0]!r}")


class Upstream:
    """Results of ``_upstream_probe.py``: megatron-core run without (some of) the patches."""

    def __init__(self, results: dict):
        self.results = results

    def value(self, probe: str):
        got = self.results[probe]
        assert "error" not in got, f"{probe} raised upstream: {got}"
        return got["value"]

    def raised(self, probe: str, error: str, message: str = "", where: tuple = ()) -> dict:
        """Assert that ``probe`` raised ``error`` whose message contains ``message`` and
        whose traceback has a frame in file ``where[0]`` whose source contains ``where[1]``."""
        got = self.results[probe]
        assert "error" in got, f"{probe} did not fail upstream; it returned {got['value']!r}"
        assert got["error"] == error, got
        assert message in got["message"], got
        if where:
            filename, code = where
            frames = [f for f in got["frames"] if f.startswith(filename + ":") and code in f]
            assert frames, f"{probe}: no frame in {filename} with {code!r}: {got['frames']}"
        return got


@pytest.fixture(scope="session")
def upstream() -> Upstream:
    if "upstream" not in _BACKGROUND:
        pytest.skip("the upstream probe runs only without CUDA")
    return Upstream(_BACKGROUND["upstream"].result())


@pytest.fixture(scope="session")
def registry_under_cuda() -> dict:
    if "registry" not in _BACKGROUND:
        pytest.skip("runs only without CUDA")
    return _BACKGROUND["registry"].result()


@pytest.fixture(scope="module")
def tiny_config():
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                             use_cpu_initialization=True, pipeline_dtype=torch.float32)


@pytest.fixture(scope="module")
def make_tiny(tiny_config):
    """``make_tiny(seed)``: a small two-layer MegatronModule, its weights drawn from ``seed``."""
    import torch
    from megatron.core.transformer.enums import ModelType
    from megatron.core.transformer.module import MegatronModule

    class Tiny(MegatronModule):
        def __init__(self, seed: int):
            super().__init__(tiny_config)
            self.model_type = ModelType.encoder_or_decoder
            gen = torch.Generator().manual_seed(seed)
            self.l1 = torch.nn.Linear(4, 8)
            self.l2 = torch.nn.Linear(8, 1)
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen))

        def forward(self, x):
            return self.l2(torch.tanh(self.l1(x)))

        def set_input_tensor(self, tensor):
            pass

    return Tiny

import multiprocessing.process
import os
import subprocess
import traceback

import pytest

from megatron_mm.startup import prepare_megatron_core

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# This process is an entry point: the CPU patches go in before any test imports
# Megatron-Core (a subprocess a test starts calls it itself).
prepare_megatron_core()

_TOOLCHAIN_FRAMES = tuple(os.sep + os.path.join(*p.split("/")) + os.sep for p in (
    "torch/_inductor", "triton", "transformer_engine", "ctypes"))


@pytest.fixture(autouse=True)
def _processes_marked(request, monkeypatch):
    """Tests that start processes carry the ``processes`` marker (``make test-fast`` leaves
    them out): in a test without it, starting a process or a rank fails the test. A
    library's own toolchain calls are part of running in one process: torch's compiler
    (Megatron-Core's fused activations) asking the C++ compiler once per process, Triton's
    and Transformer Engine's builds, ``ctypes.util.find_library``."""
    if request.node.get_closest_marker("processes") is not None:
        return

    def guarded(real):
        def start(*args, **kwargs):
            if not any(part in frame.filename for frame in traceback.extract_stack()
                       for part in _TOOLCHAIN_FRAMES):
                pytest.fail(f"{request.node.nodeid} starts a process: mark it "
                            "pytest.mark.processes (tests/conftest.py)")
            return real(*args, **kwargs)
        return start

    monkeypatch.setattr(subprocess.Popen, "_execute_child",
                        guarded(subprocess.Popen._execute_child))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        guarded(multiprocessing.process.BaseProcess.start))


@pytest.fixture(scope="module")
def gloo_world():
    """A 1-rank gloo world, model parallel state TP=PP=1, RNG tracker seeded."""
    from dist_harness import one_rank_world

    with one_rank_world("gloo") as parallel_state:
        yield parallel_state

import multiprocessing.process
import os
import subprocess
import traceback

import pytest
from dist_harness import start_harness_fork_server, use_harness_fork_server

from megatron_mm.startup import prepare_megatron_core

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# This process is an entry point: the CPU patches go in before any test imports
# Megatron-Core (a subprocess a test starts calls it itself).
prepare_megatron_core()
# compare's ranks (megatron_mm.hf.compare) fork from the harness's preloaded server too
use_harness_fork_server()

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
        start_harness_fork_server()
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


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """The built-in digits data, written once for every training test."""
    from megatron_mm.data.digits import prepare_digits

    out = tmp_path_factory.mktemp("digits")
    prepare_digits(out)
    return str(out)


@pytest.fixture(scope="session")
def audio_digits_dir(tmp_path_factory):
    """Images and tones of different lengths, for the two-encoder training tests."""
    from audio_data import write_audio_digits

    return write_audio_digits(str(tmp_path_factory.mktemp("audio_digits")))


@pytest.fixture(scope="session")
def one_process_reference(tmp_path_factory):
    """``one_process_reference(data_dir, model_flags)`` -> ``(argv, result)``: an initial
    checkpoint and the one-process run of ``REFERENCE_STEPS`` steps from it, made once per
    data and model for the whole session; the parallel runs load the same checkpoint (stages
    draw different random streams). Shared by the pipeline, audio and sequence-parallel
    equivalence tests."""
    from dist_harness import run_distributed
    from equivalence import REFERENCE_STEPS
    from gdn_cp_check import train_runs
    from train_workers import TINY_MODEL

    made = {}

    def reference(data_dir, model=()):
        key = (data_dir, tuple(model))
        if key not in made:
            init = str(tmp_path_factory.mktemp("init"))
            common = TINY_MODEL + ["--data-path", data_dir, "--micro-batch-size", "2",
                                   "--global-batch-size", "8", *model]
            argv = common + ["--train-iters", str(REFERENCE_STEPS), "--load", init,
                             "--no-load-optim"]
            # the checkpoint, then the run from it: one launch
            made[key] = argv, run_distributed(train_runs, 1, [
                (common + ["--train-iters", "0", "--save", init], ()),
                (argv, (1, REFERENCE_STEPS))])[0][1]
        return made[key]
    return reference


@pytest.fixture
def te_placeholder_specs(monkeypatch):
    """``get_layer_specs("transformer_engine")`` run through on Megatron-Core's TE spec
    code: without TE its TE classes are placeholders, enough to read the specs' structure
    (never to build a layer)."""
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.models.gpt import gpt_layer_specs

    from megatron_mm.models import specs

    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", TESpecProvider)
    monkeypatch.setattr(specs, "transformer_engine_available", lambda: True)
    return specs.get_layer_specs

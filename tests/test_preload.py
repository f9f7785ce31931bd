"""Importing what the test harness's fork server preloads (``dist_harness._PRELOAD``) does
not initialise CUDA, so the ranks it forks can use it: no ``torch.cuda.init`` /
``_lazy_init``, and no ``torch.cuda.is_available()`` that asks the CUDA driver (it does
unless PYTORCH_NVML_BASED_CUDA_CHECK=1, which the package sets at import for Megatron-Core's
own import-time call; ``device_count()`` asks NVML). Checked in a fresh interpreter whose
``torch.cuda`` records those calls, with and without the harness's environment; on CPU as
on a GPU machine (where a forked rank then fails: "Cannot re-initialize CUDA in forked
subprocess")."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_harness import _PRELOAD, FORKSERVER_ENV

REPO = Path(__file__).resolve().parents[1]
PROBE = r"""
import json, os, sys, traceback
import torch
calls = []

def record(name, result=None):
    def call(*args, **kwargs):
        nvml = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"
        if name != "is_available" or not nvml:  # NVML's answer leaves CUDA alone
            calls.append([name, traceback.extract_stack()[-2].filename])
        return result
    return call

torch.cuda.init = record("init")
torch.cuda._lazy_init = record("_lazy_init")
torch.cuda.is_available = record("is_available", False)
for module in json.loads(sys.argv[1]):
    __import__(module)
print("PRELOAD-CALLS " + json.dumps(calls))
"""


def _calls(extra_env):
    """[call, its caller's file] of the recorded calls."""
    env = {k: v for k, v in os.environ.items() if k not in FORKSERVER_ENV}
    env.update(HF_HUB_OFFLINE="1", **extra_env)
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(_PRELOAD)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("PRELOAD-CALLS ")][-1]
    return json.loads(line[len("PRELOAD-CALLS "):])


@pytest.mark.parametrize("harness_env", [True, False], ids=["fork-server-env", "plain"])
def test_preloaded_imports_leave_cuda_uninitialised(harness_env):
    calls = _calls(FORKSERVER_ENV if harness_env else {})
    assert calls == [], calls

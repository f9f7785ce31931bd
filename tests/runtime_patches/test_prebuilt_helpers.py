"""Patch ``prebuilt_helpers``: Megatron-LM's ``_compile_dependencies`` calls
``compile_helpers``, whose ``make`` fails in the wheel's install (no Makefile), though its
``helpers_cpp`` is compiled: skipped where that imports, run as upstream where not."""

import builtins
import os
import subprocess

import pytest
from megatron.core.datasets import utils


@pytest.mark.processes
def test_upstream_make_fails_in_the_installed_folder():
    folder = os.path.dirname(utils.__file__)
    assert not os.path.exists(os.path.join(folder, "Makefile"))
    assert subprocess.run(["make", "-C", folder], capture_output=True).returncode != 0


def test_skipped_where_prebuilt_and_upstream_otherwise(monkeypatch):
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda command, *a, **k: ran.append(command)
                        or subprocess.CompletedProcess(command, 0))
    utils.compile_helpers()  # the wheel's helpers_cpp imports: nothing to build
    assert ran == []
    real_import = builtins.__import__

    def no_helpers(name, *args, **kwargs):
        if name.endswith("helpers_cpp"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_helpers)
    monkeypatch.setattr("importlib.import_module", lambda name: no_helpers(name))
    utils.compile_helpers()
    assert ran and ran[0][:2] == ["make", "-C"]

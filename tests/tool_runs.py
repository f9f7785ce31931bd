"""A tool or script run as ``python PATH ARGS`` runs it (``__main__``, its own
``sys.argv``), on one rank forked from the harness's preloaded server: its exit status and
everything it printed, without an interpreter's start-up and imports (seconds each). What it
starts (its ranks, its subprocesses) starts from there as from the command line."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback
from types import SimpleNamespace


# What the harness sets in a rank (a torchrun-like world of one, strict p2p): a command
# line has none of it
HARNESS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
               "MEGATRON_MM_STRICT_P2P")


# What must not be imported before the entry point calls prepare_megatron_core()
# (megatron_mm.startup): Megatron-Core, and the packages that check for the call at import
NEEDS_PREPARING = ("megatron", "megatron_mm.models", "megatron_mm.training",
                   "megatron_mm.runtime")


@contextlib.contextmanager
def prepared_first(path: str):
    """Fail an import of ``NEEDS_PREPARING`` made before the entry point's
    ``prepare_megatron_core()``, as a fresh interpreter does (``require_prepared``; a forked
    rank has long imported them, so their own check never runs again)."""
    import builtins

    from megatron_mm import startup

    real_import, real_prepare = builtins.__import__, startup.prepare_megatron_core
    prepared = []

    def prepare():
        prepared.append(True)
        return real_prepare()

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        if not prepared:
            base = (importlib.util.resolve_name("." * level + name, globals["__package__"])
                    if level else name)
            if base == "megatron_mm.prepared":  # the call as an import
                prepared.append(True)
            for full in [base] + [f"{base}.{f}" for f in fromlist or ()]:
                if any(full == n or full.startswith(n + ".") for n in NEEDS_PREPARING):
                    raise RuntimeError(
                        f"{path} imports {full} before calling megatron_mm.startup."
                        "prepare_megatron_core(): call it first in the entry point")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__, startup.prepare_megatron_core = guarded, prepare
    try:
        yield
    finally:
        builtins.__import__, startup.prepare_megatron_core = real_import, real_prepare


def run_as_main(rank: int, path: str, argv: list, cwd: str, env: dict) -> dict:
    """``python path *argv`` in this process, with the command line's environment and
    ``env``: ``returncode``, ``stdout``, ``stderr``."""
    import runpy

    from script_runs import captured_output

    for name in HARNESS_ENV:
        os.environ.pop(name, None)
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as the interpreter does
    code = 0
    with captured_output() as out, prepared_first(path):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:  # as the interpreter reports it
            if isinstance(e.code, int) or e.code is None:
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    return {"returncode": code, **out}


def run_tool(path, *argv, cwd, env=None) -> SimpleNamespace:
    """``subprocess.run([sys.executable, path, *argv], cwd=cwd, capture_output=True,
    text=True)``'s ``returncode``, ``stdout`` and ``stderr``, from a forked rank (``env``
    set in it)."""
    from dist_harness import run_distributed

    out = run_distributed(run_as_main, 1, str(path), [str(a) for a in argv], str(cwd),
                          env or {})[0]
    return SimpleNamespace(**out)

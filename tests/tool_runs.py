"""A tool or script run as ``python PATH ARGS`` runs it (``__main__``, its own
``sys.argv``), on one rank forked from the harness's preloaded server: its exit status and
everything it printed, without an interpreter's start-up and imports (seconds each). What it
starts (its ranks, its subprocesses) starts from there as from the command line."""

from __future__ import annotations

import os
import sys
import traceback
from types import SimpleNamespace


# What the harness sets in a rank (a torchrun-like world of one, strict p2p): a command
# line has none of it
HARNESS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
               "MEGATRON_MM_STRICT_P2P")


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
    with captured_output() as out:
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

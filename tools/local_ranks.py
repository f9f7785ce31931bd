"""A bench's ranks on this machine, each its own process with torchrun's environment
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), forked from
one server process that imported torch, Megatron-Core and megatron_mm once: a tool that
launches several runs pays those imports (about 3 s of CPU per process) once instead of
per rank and run, as ``torch.distributed.run`` would. Nothing is imported or initialised in
the launching process, and no process group, thread pool or RNG use happens before the
fork. A rank's output goes to its log file; a failed rank's tail is in the error."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from typing import Dict, List, Optional

# megatron_mm.prepared first: its import is prepare_megatron_core() (the list can only import)
PRELOAD = ["megatron_mm.prepared", "megatron_mm.training.pretrain"]
# Nothing the server imports may initialise CUDA (a forked child's CUDA then fails):
# Megatron-Core asks torch.cuda.is_available() at import, which asks NVML with this set.
FORKSERVER_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world_size, port, log_dir, args, env):
    log = open(os.path.join(log_dir, f"{rank}.log"), "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1", **env)
    import torch

    torch.set_num_threads(1)
    try:
        fn(*args)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_ranks(fn, world_size: int, *args, env: Optional[Dict[str, str]] = None,
              preload=PRELOAD) -> List[str]:
    """``fn(*args)`` in ``world_size`` ranks (``fn`` a module-level function); returns each
    rank's output, or raises ``RuntimeError`` with each rank's log tail."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    for name, value in FORKSERVER_ENV.items():  # inherited by the server it starts
        os.environ.setdefault(name, value)
    mp.set_forkserver_preload(list(preload))
    with tempfile.TemporaryDirectory() as log_dir:
        try:
            mp.start_processes(_entry, args=(fn, world_size, free_port(), log_dir, args,
                                             env or {}),
                               nprocs=world_size, start_method="forkserver", join=True)
        except ProcessException as e:  # a rank raised or exited
            tails = []
            for rank in range(world_size):
                with open(os.path.join(log_dir, f"{rank}.log")) as f:
                    tails.append(f"rank {rank}:\n{f.read()[-5000:]}")
            raise RuntimeError("\n".join(tails)) from e
        logs = []
        for rank in range(world_size):
            with open(os.path.join(log_dir, f"{rank}.log")) as f:
                logs.append(f.read())
        return logs


def _script_rank(path: str, argvs: List[List[str]], ports: List[int], pin: bool) -> None:
    """Rank r: ``python path *argvs[r]``, a world of one of its own on ``ports[r]``,
    pinned to core r where ``pin`` (as ``taskset -c r``)."""
    import runpy
    import sys

    rank = int(os.environ["RANK"])
    if pin:
        os.sched_setaffinity(0, {rank})
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_PORT=str(ports[rank]))
    sys.argv = [path, *argvs[rank]]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:  # the script's own exit: a failure only if not 0
        if e.code:
            raise


def run_scripts(path, argvs: List[List[str]], pin: bool = False) -> List[str]:
    """``python path *argv`` for each of ``argvs`` at once, each forked from the preloaded
    server (a fresh interpreter's imports cost seconds), each its own world of one, rank r
    on core r where ``pin``; returns their outputs, or raises ``RuntimeError`` as
    ``run_ranks``."""
    socks = [socket.socket() for _ in argvs]
    try:  # held open together: distinct ports
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    return run_ranks(_script_rank, len(argvs), str(path), [list(map(str, a)) for a in argvs],
                     ports, pin)

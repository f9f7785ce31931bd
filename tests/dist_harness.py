"""Run a function in N gloo processes (patched like any megatron_mm process) and collect
each rank's return value; a rank's exception fails the test with its traceback.

Ranks start from a fork server that has imported torch, Megatron-Core and megatron_mm
once (about 7 s of CPU per process otherwise; the suite starts some hundred ranks) and
asked Inductor's CPU probe (2 s more, ``inductor_isa.py``). No
process group, thread pool or RNG use happens before the fork. Pipeline point-to-point
runs in its strict mode (``MEGATRON_MM_STRICT_P2P=1``, ``runtime/mailbox.py``)."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import traceback
from typing import Dict, Optional

import torch
import torch.multiprocessing as mp

from megatron_mm.startup import prepare_megatron_core


# Store ports come from below the kernel's ephemeral range: a port bound to 0 and let go
# (the old way) could be handed meanwhile to a socket bound to 0 elsewhere (gloo's pair
# connections listen on such ports, in this test worker's ranks or another's) before the
# store binds it. Each pytest-xdist worker takes its own block, in turn from an offset of
# its process's own (two pytest runs side by side share the block).
_PORT_BLOCK = 1000
_next_port = [os.getpid()]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = _ephemeral_low() - _PORT_BLOCK * (worker + 1)
    for _ in range(_PORT_BLOCK):
        port = first + _next_port[0] % _PORT_BLOCK
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken (or still closing): the next one
                continue
        return port
    raise RuntimeError(f"no free port in {first}-{first + _PORT_BLOCK - 1}")


def _entry(rank, fn, world_size, port, out_dir, args, env):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **env)
    # Sends wait for their receives, as NCCL's do: an order that hangs there fails here.
    os.environ.setdefault("MEGATRON_MM_STRICT_P2P", "1")
    prepare_megatron_core()  # done by the fork server's preload (a no-op here)

    torch.set_num_threads(1)
    try:
        result = fn(rank, *args)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, os.path.join(out_dir, f"{rank}.pt"))
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    torch.save({"result": result}, os.path.join(out_dir, f"{rank}.pt"))


# megatron_mm.prepared first: its import is the entry call (the list can only import).
# tests.inductor_isa: Inductor's CPU probe once for every rank; Python 3.11's fork server
# imports from its working directory, the repository root under ``make test`` (from
# elsewhere the import fails quietly there, and each rank probes for itself).
# megatron_mm.hf.compare: compare's ranks fork from the same server (tests/conftest.py).
# megatron.training: Megatron-LM's training package (the flag factory's, Megatron-LM's
# pretrain), imported once rather than in each rank's first run.
# tests.compile_warmup: Megatron-Core's compiled quick_gelu, traced once for every rank.
PRELOAD = ["megatron_mm.prepared", "megatron_mm.training.pretrain", "megatron_mm.hf.compare",
           "megatron.training", "tests.inductor_isa", "tests.compile_warmup"]
# The fork server imports PRELOAD and forks every rank: nothing there may initialise CUDA
# (a forked child's CUDA then fails). Megatron-Core asks torch.cuda.is_available() at
# import (dist_checkpointing), which initialises the driver unless torch asks NVML instead
# (megatron_mm sets this at import too; set here before the fork server starts).
FORKSERVER_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}

# The mailbox's waits as on NCCL, without strict mode's wait-for-everything that hides a
# missing one (runtime/nccl_coalescing.py)
NCCL_COALESCING = {"MEGATRON_MM_STRICT_P2P": "0", "MEGATRON_MM_EMULATE_NCCL_COALESCING": "1"}


def use_harness_fork_server() -> None:
    """Every forkserver process this one starts (``run_distributed``'s, ``compare``'s ranks)
    forks from one server that preloads ``PRELOAD``, whichever starts it first."""
    for name, value in FORKSERVER_ENV.items():  # inherited by the fork server it starts
        os.environ.setdefault(name, value)
    mp.set_forkserver_preload(PRELOAD)


def start_harness_fork_server() -> None:
    """Start that server now, before a test's tool sets a shorter preload list of its own
    (``convert_hf.py compare``'s ``RANK_PRELOAD``): the first list a server starts with
    is the one every later rank gets."""
    from multiprocessing import forkserver

    use_harness_fork_server()
    forkserver.ensure_running()


def run_distributed(fn, world_size: int, *args, env: Optional[Dict[str, str]] = None):
    """``fn(rank, *args)`` on ``world_size`` ranks, with ``env`` set in each; returns the
    list of results by rank."""
    use_harness_fork_server()
    with tempfile.TemporaryDirectory() as out_dir:
        try:
            mp.start_processes(_entry, args=(fn, world_size, free_port(), out_dir, args,
                                             env or {}),
                               nprocs=world_size, start_method="forkserver", join=True)
        except mp.ProcessRaisedException:
            errors = []
            for rank in range(world_size):
                path = os.path.join(out_dir, f"{rank}.pt")
                if os.path.exists(path):
                    saved = torch.load(path, weights_only=False)
                    errors.append(f"rank {rank}:\n" + saved.get("error", "ok"))
            raise AssertionError("\n".join(errors)) from None
        return [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False)["result"]
                for r in range(world_size)]


@contextlib.contextmanager
def one_rank_world(backend: str):
    """A 1-rank ``backend`` world (unless one exists), model parallel state TP=PP=1, the
    RNG tracker seeded; yields Megatron-Core's ``parallel_state``."""
    prepare_megatron_core()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    owns_group = not torch.distributed.is_initialized()
    if owns_group:
        torch.distributed.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    try:
        yield parallel_state
    finally:
        parallel_state.destroy_model_parallel()
        if owns_group:
            torch.distributed.destroy_process_group()


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all_single", "barrier",
               "gather", "scatter", "all_gather_object", "broadcast_object_list")


def log_collectives() -> dict:
    """From now on, record every collective this process issues: group (its global ranks)
    -> [(op, shape, dtype)] in call order. The ranks of a group must hold the same list,
    or NCCL pairs different calls (a hang, or wrong data). Point-to-point is not logged."""
    import torch.distributed as dist

    log: dict = {}

    def wrap(name, fn):
        def logged(*args, **kwargs):
            group = kwargs.get("group")
            if group is None:
                group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
            what = (name, tuple(tensor.shape), str(tensor.dtype)) if tensor is not None \
                else (name,)
            log.setdefault(ranks, []).append(what)
            return fn(*args, **kwargs)
        return logged

    for name in COLLECTIVES:
        fn = getattr(dist, name)
        setattr(dist, name, wrap(name, fn))
        setattr(dist.distributed_c10d, name, getattr(dist, name))
    return log


def mismatched_collectives(ranks_logs: list) -> list:
    """(group, rank, its calls, the first member's calls) wherever a group's members
    issued different collectives (``log_collectives``, one log per rank)."""
    bad = []
    for groups in ranks_logs:
        for ranks, calls in groups.items():
            for r in ranks:
                if ranks_logs[r].get(ranks) != calls:
                    bad.append((ranks, r, ranks_logs[r].get(ranks), calls))
    return bad

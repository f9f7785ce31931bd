"""Ranks that run the training script's entry as ``examples/pretrain_mllm.py`` does (a
user's error: one line from rank 0, exit status 2), several runs in one launch, each with
everything the ranks print captured (file descriptors 1 and 2: Python, C and logging)."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
import tempfile
import time


@contextlib.contextmanager
def captured_output():
    """Yields a dict that holds ``stdout`` and ``stderr`` once the block is done."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    files = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    out: dict = {}
    try:
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        yield out
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)
        for name, f in zip(("stdout", "stderr"), files):
            f.seek(0)
            out[name] = f.read().decode(errors="replace")
            f.close()


@contextlib.contextmanager
def full_disk_in(directory_name: str):
    """Writes of checkpoint shards into a directory named ``directory_name`` (one
    iteration's) write a few bytes, then fail as on a full disk (in Megatron-Core's writer
    threads, where a real ``ENOSPC`` is raised)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    real = filesystem_async._write_item

    @functools.wraps(real)  # its signature: the writer inspects it
    def write_item(*args, **kwargs):
        stream = next(a for a in args if hasattr(a, "write") and hasattr(a, "name"))
        if directory_name in str(stream.name):
            stream.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    filesystem_async._write_item = write_item
    try:
        yield
    finally:
        filesystem_async._write_item = real


def run_as_script(rank: int, argv: list, flags_from_checkpoint: bool = True) -> dict:
    """The script's entry on ``argv``: ``code`` (0, or the exit status of a user's error),
    ``losses``, and what this rank printed. ``flags_from_checkpoint=False``: the model is
    the flags' alone, as a caller that builds its own model has it."""
    from megatron_mm.training.cli.arguments import build_parser, parse_args
    from megatron_mm.training.config.validation import validate_args
    from megatron_mm.training.main import run_job
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig

    world = int(os.environ["WORLD_SIZE"])
    result = {"code": 0, "losses": None}

    def job():
        args = (parse_args(argv, world) if flags_from_checkpoint else
                validate_args(build_parser().parse_args(argv), world))
        return pretrain(RunConfig.from_flags(args))

    with captured_output() as out:
        try:  # the script's error reporting and shutdown (training/main.py)
            result["losses"] = run_job(job)["losses"]
        except SystemExit as exit_:  # a bad flag, a user's error, a peer's stop
            result["code"] = exit_.code
    return {**result, **out}


def run_all_as_script(rank: int, runs: list, directory: str) -> list:
    """``run_as_script`` for each of ``runs`` (dicts: ``argv``, optional
    ``flags_from_checkpoint``, and ``full_disk_on_rank``: that rank's writes into
    ``full_disk_in`` fail), one after another in this process, each in a process group of
    its own: rank 0 picks a free port when the run starts (ports picked earlier may be
    taken by then, gloo's connections listen on free ports too) and hands it to the
    other ranks in a file in ``directory``."""
    import torch
    from dist_harness import free_port
    from megatron.core import parallel_state

    results = []
    for i, run in enumerate(runs):
        os.environ["MASTER_PORT"] = _port_of_run(os.path.join(directory, f"{i}.port"),
                                                 free_port if rank == 0 else None)
        full_disk = (full_disk_in(run["full_disk_in"])
                     if run.get("full_disk_on_rank") == rank else contextlib.nullcontext())
        with full_disk:
            results.append(run_as_script(rank, run["argv"],
                                         run.get("flags_from_checkpoint", True)))
        parallel_state.destroy_model_parallel()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return results


def _port_of_run(path: str, pick, timeout_s: float = 300.0) -> str:
    """``pick()``'s port, written to ``path`` (rank 0), or the port read from it."""
    if pick is not None:
        with open(path + ".tmp", "w") as f:
            f.write(str(pick()))
        os.replace(path + ".tmp", path)
    deadline = time.time() + timeout_s
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"rank 0 wrote no {path}")
        time.sleep(0.05)
    return open(path).read()

"""ProcessGroupNCCL's watchdog, emulated on gloo: on NCCL a background thread checks every
Work the process enqueued and, when one has not finished within the group's timeout
(``--distributed-timeout-minutes``), aborts the communicators and tears the process down
("Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds
before timing out"; ``TORCH_NCCL_ASYNC_ERROR_HANDLING``'s default). gloo has no such
thread and its blocking calls simply wait, so a rank that enqueues a collective its peers
reach only after a long computation passes on CPU and dies on GPU.

``emulate_nccl_watchdog(timeout_s)`` wraps torch.distributed's collectives and
point-to-point calls: each call or returned Work is watched from its start until it
returns, reports completion (``is_completed``: gloo's async collectives) or is waited
on (gloo's p2p Works complete only in ``wait``); past ``timeout_s`` the process exits
with NCCL's message, as the watchdog's abort does."""

from __future__ import annotations

import os
import sys
import threading
import time

from dist_harness import COLLECTIVES

P2P = ("isend", "irecv", "send", "recv", "batch_isend_irecv")


def emulate_nccl_watchdog(timeout_s: float, poll_s: float = 0.02) -> None:
    import torch.distributed as dist

    # id(Work) (the Work held), or a serial number while a blocking call runs -> (op, start)
    pending: dict = {}
    lock = threading.Lock()
    serial = iter(range(-1, -(1 << 62), -1))

    def wrap(name, fn):
        def watched(*args, **kwargs):
            key = next(serial)
            with lock:
                pending[key] = (name, time.monotonic(), None)
            try:
                out = fn(*args, **kwargs)
            finally:
                with lock:
                    pending.pop(key, None)
            now = time.monotonic()
            with lock:
                for w in out if isinstance(out, list) else [out]:
                    if isinstance(w, dist.Work):
                        pending.setdefault(id(w), (name, now, w))
            return out
        return watched

    for name in COLLECTIVES + P2P:
        setattr(dist, name, wrap(name, getattr(dist, name)))
        setattr(dist.distributed_c10d, name, getattr(dist, name))
    wait = dist.Work.wait

    def wait_and_forget(self, *args, **kwargs):
        out = wait(self, *args, **kwargs)
        with lock:
            pending.pop(id(self), None)
        return out
    dist.Work.wait = wait_and_forget

    def watchdog():
        while True:
            time.sleep(poll_s)
            now = time.monotonic()
            with lock:
                for key, (op, start, work) in list(pending.items()):
                    if work is not None and work.is_completed():
                        del pending[key]
                    elif now - start > timeout_s:
                        print(f"[Rank {dist.get_rank()}] Watchdog caught collective operation "
                              f"timeout: WorkNCCL(OpType={op}, Timeout(ms)="
                              f"{int(timeout_s * 1000)}) ran for {int((now - start) * 1000)} "
                              f"milliseconds before timing out.", file=sys.stderr, flush=True)
                        os._exit(6)
    threading.Thread(target=watchdog, daemon=True).start()

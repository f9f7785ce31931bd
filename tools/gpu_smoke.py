"""The GPU node's smoke step (``make gpu-check``'s first check): prints one JSON line.

- a bf16 matmul on the GPU, checked against an fp32 one and timed (TFLOP/s);
- an NCCL world of one: an all-reduce on the GPU, then a barrier;
- the CPU patches: ``prepare_megatron_core()`` on a CUDA machine applies only the
  patches needed there (``megatron_mm/runtime_patches/registry.py``: none of the "no CUDA" ones).

Exits 1 with the failing part named when any part fails.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def matmul(n: int = 8192, reps: int = 10) -> dict:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ref = a[:256].float() @ b.float()
    err = ((a[:256] @ b).float() - ref).abs().max().item() / ref.abs().max().item()
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    return {"bf16_matmul_tflops": round(2 * n**3 / seconds / 1e12, 1),
            "bf16_matmul_rel_err": err, "ok": err < 2e-2}


def nccl_world_of_one() -> dict:
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        x = torch.full((1024,), 3.0, device="cuda")
        dist.all_reduce(x)
        dist.barrier()
        ok = bool((x == 3.0).all().item())
        return {"nccl_version": ".".join(map(str, torch.cuda.nccl.version())), "ok": ok}
    finally:
        dist.destroy_process_group()


def patches() -> dict:
    from megatron_mm.runtime_patches import PATCHES
    from megatron_mm.runtime_patches.registry import NO_CUDA
    from megatron_mm.startup import prepare_megatron_core

    applied = prepare_megatron_core()  # what an entry point applies on this machine
    wrong = [p.name for p in PATCHES if p.needed_when == NO_CUDA and p.name in applied]
    return {"patches_applied": applied, "no_cuda_patches_applied": wrong, "ok": not wrong}


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device (torch.cuda.is_available() "
                          f"is False; torch {torch.__version__})"}))
        return 1
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    failed = []
    for name, part in (("matmul", matmul), ("nccl", nccl_world_of_one), ("patches", patches)):
        start = time.perf_counter()
        try:
            result = part()
        except Exception as e:  # noqa: BLE001  (each part is reported, not raised)
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        result["seconds"] = round(time.perf_counter() - start, 2)
        out[name] = result
        if not result["ok"]:
            failed.append(name)
    out["ok"] = not failed
    out["failed"] = failed
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

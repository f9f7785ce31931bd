"""Start-up time and resident memory of the JSONL data path, before and after the lazy index.

Writes synthetic JSONL files (conversations with one image each, every image a path to one
of a few small PNG files) of each ``--records`` size, then, in a fresh process per
measurement, opens the training dataset and reads its first micro-batch:

- before: the eager reader every rank ran up to this change (``read_records``: the whole
  file parsed into Record objects, every image path checked), as MultimodalDataset did;
- after: ``MultimodalDataset`` over the lazy index (one scan for line offsets; records
  parsed and checked when read).

Start-up is the seconds from nothing to the first encoded micro-batch (wall clock, and
the process's CPU time, steadier on a shared machine); RSS is the
process's resident memory then, minus what it held after its imports (so the figure is
the data's). Example::

    python tools/bench_data.py --records 100000 1000000

``--tp-broadcast``: who reads and decodes the training micro-batches on one node of
TP=2 x PP=2 (four gloo ranks, the training run's own iterators:
``data_setup.batch_iterator``), before (every rank its own copy) and after
(``tensor_parallel_batches``: the first TP rank of each stage reads and decodes, the
others receive the collated micro-batch by broadcast, the pixels only where the stage
embeds images). The figure is a count (samples decoded, each with its image, per
micro-batch, summed over the node's ranks), so it holds on a loaded machine; the CPU
seconds each rank spent getting its micro-batches are printed beside it::

    python tools/bench_data.py --tp-broadcast [--micro-batches 16] [--image-px 448]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MEASURE = r"""
import json, os, sys, time
import psutil
mode, path, mbs = sys.argv[1], sys.argv[2], int(sys.argv[3])
from megatron_mm.data import ImageProcessorConfig, build_tokenizer, collate
from megatron_mm.data.dataset import MultimodalDataset
from megatron_mm.data.processing import encode_record
from megatron_mm.data.records import read_records
tok, cfg = build_tokenizer(), ImageProcessorConfig(image_size=16)
proc = psutil.Process()
base = proc.memory_info().rss
t0, c0 = time.perf_counter(), time.process_time()
if mode == "before":
    records = read_records(path)
    samples = [encode_record(r, tok, {"image": 4}, cfg, 64) for r in records[:mbs]]
    n, index_bytes = len(records), 0
else:
    ds = MultimodalDataset(path, tok, {"image": 4}, cfg, 64)
    samples = [ds[i] for i in range(mbs)]
    n = len(ds)
    index_bytes = sum(a.nbytes for a in (ds.records.offsets, ds.records.lengths,
                                         ds.records.line_numbers) if a is not None)
batch = collate(samples, tok.pad_id)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"records": n, "startup_s": elapsed, "cpu_s": cpu,
                  "rss_mb": (proc.memory_info().rss - base) / 2**20,
                  "index_mb": index_bytes / 2**20}))
"""


def write_synthetic(directory: str, n: int, px: int = 16) -> str:
    """``n`` records, images by path to 4 PNGs of ``px`` x ``px`` (written once per
    directory and size)."""
    from PIL import Image

    os.makedirs(os.path.join(directory, "img"), exist_ok=True)
    for k in range(4):
        png = os.path.join(directory, "img", f"{k}_{px}.png")
        if not os.path.exists(png):
            noise = Image.effect_noise((px, px), 40 + 10 * k).convert("RGB")  # not trivially
            noise.save(png)  # compressible: decoding costs as a photo's would
    path = os.path.join(directory, f"synthetic_{n}_{px}.jsonl")
    if os.path.exists(path):
        return path
    buf = io.StringIO()
    with open(path + ".tmp", "w") as f:
        for i in range(n):
            buf.write(json.dumps({
                "id": f"s{i}", "images": [f"img/{i % 4}_{px}.png"],
                "conversations": [{"from": "human", "value": "<image>\nWhat colour is it?"},
                                  {"from": "gpt", "value": f"colour number {i % 4}"}]}) + "\n")
            if i % 10000 == 9999:
                f.write(buf.getvalue())
                buf = io.StringIO()
        f.write(buf.getvalue())
    os.replace(path + ".tmp", path)
    return path


def measure(mode: str, path: str, micro_batch_size: int, timeout: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", _MEASURE, mode, path, str(micro_batch_size)],
                         capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{mode} on {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# the tiny model of the tests: images resized to 16 x 16 (the decode is the PNG's)
TP_BROADCAST_FLAGS = [
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--seq-length", "64", "--vision-hidden-size", "32",
    "--vision-num-layers", "2", "--vision-num-attention-heads", "2", "--img-h", "16",
    "--img-w", "16", "--patch-dim", "4", "--disable-vision-class-token",
    "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
]


def _tp_rank(rank: int, world: int, port: int, mode: str, path: str, micro_batches: int,
             out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    from megatron_mm.startup import prepare_megatron_core

    prepare_megatron_core()
    import time

    import torch
    from megatron.core import parallel_state

    from megatron_mm.data.dataset import MultimodalDataset
    from megatron_mm.training.assembly.data_setup import (batch_iterator, build_datasets,
                                                 tensor_parallel_batches)
    from megatron_mm.training.planning.training_plan import plan_pipeline
    from megatron_mm.training.cli.arguments import parse_run_config
    from megatron_mm.training.loop.trainer import model_config_for, tokenizer_from_config

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(2, 2)
    config = parse_run_config(TP_BROADCAST_FLAGS + ["--data-path", path, "--valid-data-path",
                                                    path], world_size=world)
    tokenizer = tokenizer_from_config(config)
    plan = plan_pipeline(config, model_config_for(config, tokenizer))
    train_ds, _ = build_datasets(config, tokenizer)
    decoded = [0]
    encode = MultimodalDataset.encode

    def counted(self, idx):
        decoded[0] += 1
        return encode(self, idx)

    MultimodalDataset.encode = counted
    make = lambda: batch_iterator(config, train_ds, tokenizer, 0, shuffle=True)  # noqa: E731
    torch.distributed.barrier()
    c0 = time.process_time()
    it = tensor_parallel_batches(config, plan, make) if mode == "after" else make()
    pixels = 0
    for _ in range(micro_batches):
        batch = next(it)
        image = batch["media"]["image"]
        pixels += int(image.untyped_storage().nbytes() > image.element_size())
    cpu = time.process_time() - c0
    with open(os.path.join(out, f"{mode}_{rank}.json"), "w") as f:
        json.dump({"decoded": decoded[0], "cpu_s": cpu, "pixels": pixels,
                   "tp": parallel_state.get_tensor_model_parallel_rank(),
                   "pp": parallel_state.get_pipeline_model_parallel_rank()}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def tp_broadcast(workdir: str, micro_batches: int, image_px: int) -> None:
    """Both modes on four ranks; the table of what each rank decoded."""
    import socket

    import torch.multiprocessing as mp

    sys.path.insert(0, ROOT)
    path = write_synthetic(workdir, 64, image_px)
    rows = {}
    for mode in ("before", "after"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(_tp_rank, args=(4, port, mode, path, micro_batches, workdir),
                           nprocs=4, start_method="spawn", join=True)
        rows[mode] = [json.load(open(os.path.join(workdir, f"{mode}_{r}.json")))
                      for r in range(4)]
        print(f"  measured {mode}", file=sys.stderr, flush=True)
    print(f"TP=2 x PP=2 on one node (4 ranks), {micro_batches} micro-batches of 2 samples "
          f"per rank, {image_px} x {image_px} PNGs")
    print("| reader | samples decoded per micro-batch (node) | per rank (TP, PP): decoded / "
          "pixels received | CPU s per micro-batch, TP rank 0 / 1 |")
    print("|---|---:|---|---|")
    for mode, label in (("before", "every rank its own copy (main)"),
                        ("after", "TP rank 0 reads, broadcast (this change)")):
        r = rows[mode]
        ranks = ", ".join(f"({x['tp']},{x['pp']}): {x['decoded']} / {x['pixels']}" for x in r)
        cpu = [sum(x["cpu_s"] for x in r if x["tp"] == t) / 2 / micro_batches for t in (0, 1)]
        print(f"| {label} | {sum(x['decoded'] for x in r) / micro_batches:.1f} | {ranks} | "
              f"{cpu[0]:.4f} / {cpu[1]:.4f} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, nargs="+", default=[100000, 1000000],
                   help="synthetic file sizes (records)")
    p.add_argument("--workdir", default=None,
                   help="where the synthetic files go (kept and reused; default: a "
                        "temporary directory removed afterwards)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--modes", nargs="+", choices=["before", "after"],
                   default=["before", "after"])
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--tp-broadcast", action="store_true",
                   help="instead: samples decoded per micro-batch on a TP=2 x PP=2 node, "
                        "every rank reading (before) and TP rank 0 broadcasting (after)")
    p.add_argument("--micro-batches", type=int, default=16)
    p.add_argument("--image-px", type=int, default=448,
                   help="--tp-broadcast: the PNGs' size (decoded, then resized to 16)")
    args = p.parse_args(argv)

    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    workdir = args.workdir or tmp.name
    if args.tp_broadcast:
        try:
            tp_broadcast(workdir, args.micro_batches, args.image_px)
        finally:
            if tmp is not None:
                tmp.cleanup()
        return
    rows = []
    try:
        for n in args.records:
            path = write_synthetic(workdir, n)
            size_mb = os.path.getsize(path) / 2**20
            for mode in args.modes:
                r = measure(mode, path, args.micro_batch_size, args.timeout)
                rows.append((n, size_mb, mode, r))
                print(f"  measured {mode} on {n} records", file=sys.stderr, flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print("| records | file (MB) | reader | start-up to first batch (s) | CPU (s) | RSS (MB) "
          "| index (MB) |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for n, size_mb, mode, r in rows:
        reader = ("eager read_records (main)" if mode == "before"
                  else "lazy JsonlRecords (this change)")
        print(f"| {n} | {size_mb:.1f} | {reader} | {r['startup_s']:.4f} | {r['cpu_s']:.4f} | "
              f"{r['rss_mb']:.1f} | {r['index_mb']:.3f} |")


if __name__ == "__main__":
    main()

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


def write_synthetic(directory: str, n: int) -> str:
    """``n`` records, images by path to 4 small PNGs (written once per directory)."""
    from PIL import Image

    os.makedirs(os.path.join(directory, "img"), exist_ok=True)
    for k in range(4):
        png = os.path.join(directory, "img", f"{k}.png")
        if not os.path.exists(png):
            Image.new("RGB", (16, 16), (60 * k, 20, 200)).save(png)
    path = os.path.join(directory, f"synthetic_{n}.jsonl")
    if os.path.exists(path):
        return path
    buf = io.StringIO()
    with open(path + ".tmp", "w") as f:
        for i in range(n):
            buf.write(json.dumps({
                "id": f"s{i}", "images": [f"img/{i % 4}.png"],
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
    args = p.parse_args(argv)

    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    workdir = args.workdir or tmp.name
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

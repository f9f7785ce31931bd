"""Step time with balanced batching vs random batching, DP=2, side by side.

Writes a heterogeneous multimodal dataset (1 to 4 images per sample, questions and answers
of widely varying length), then trains the same tiny model on it twice with torchrun and
the same flags, once with ``--data-balance none`` (random micro-batches of
``--micro-batch-size`` samples padded to their longest) and once with ``--data-balance
isf-sorted`` (packed, rank-balanced micro-batches of that many samples on average), and
prints per mode: step time (median over the timed steps), samples, real tokens (pad
excluded) and computed tokens (pad included) per step, then the ratios. Since a balanced
step holds a few more samples (the bound search aims at [B, B + 1] per micro-batch), the
figure to read is the step time at equal real tokens per step:
(time / real token, balanced) / (time / real token, random).

    python tools/bench_balance.py                       # DP=2 on CPU (gloo)
    python tools/bench_balance.py --steps 40 --samples 1200 --repeats 2

Runs alternate A B (A B ...) so machine noise hits both; speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

MODES = ("none", "isf-sorted")
WORDS = ("the chart shows a value of red blue green bar line axis year total sales mean "
         "document page table figure left right top bottom label answer question").split()


def model_flags(a) -> list:
    # Hidden size large against the sequence, as in real MLLMs (InternLM2-20B: 6144 vs
    # 6016-token packs): local-spec attention computes the whole packed S x S block and
    # masks it, so a tiny hidden size would measure that waste rather than the balance.
    return ["--num-layers", "2", "--hidden-size", str(a.hidden_size),
            "--ffn-hidden-size", str(4 * a.hidden_size), "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2",
            "--seq-length", str(a.seq_length), "--vision-hidden-size", str(a.hidden_size // 2),
            "--vision-num-layers", "2", "--vision-num-attention-heads", "4",
            "--img-h", str(a.img_size), "--img-w", str(a.img_size), "--patch-dim", "4",
            "--disable-vision-class-token", "--transformer-impl", "local",
            "--lr", "1e-4", "--lr-decay-style", "constant", "--seed", "1234",
            "--micro-batch-size", str(a.micro_batch_size),
            "--global-batch-size", str(a.micro_batch_size * 2 * a.microbatches),
            "--train-iters", str(a.warmup + a.steps), "--log-interval", str(a.warmup + a.steps),
            "--eval-interval", str(10 ** 6), "--skip-final-eval"]


def _png(rng: random.Random, size: int) -> str:
    from PIL import Image

    img = Image.frombytes("RGB", (size, size), bytes(rng.randrange(256)
                                                      for _ in range(size * size * 3)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def write_dataset(out: Path, samples: int, img_size: int, seed: int = 0) -> None:
    """``samples`` training records (and a few validation ones): 1-4 images each, a
    question of 3-120 words and an answer of 1-40 words, independently drawn."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.jsonl", samples), ("valid.jsonl", 8)):
        with open(out / name, "w") as f:
            for i in range(n):
                k = rng.randint(1, 4)
                human = "<image>\n" * k + _text(rng, 3, 60) + "?"
                f.write(json.dumps({
                    "id": f"{name[:5]}-{i}",
                    "conversations": [{"from": "human", "value": human},
                                      {"from": "gpt", "value": _text(rng, 1, 40)}],
                    "images": [_png(rng, img_size) for _ in range(k)]}) + "\n")


def worker(a) -> None:
    """One rank of one training run (under torchrun): times steps, counts tokens."""
    import torch

    import megatron_mm.training.pretrain as pretrain
    from megatron_mm.data.processing import tokenize_record
    from megatron_mm.training.arguments import parse_args

    args = parse_args(model_flags(a) + ["--data-path", str(a.data), "--data-balance", a.mode])
    stamps, counts = [], {"real": 0, "computed": 0, "samples": 0}
    make = pretrain.batch_iterator

    def counted(args_, dataset, tokenizer, consumed, shuffle):
        length = {rec.id: len(tokenize_record(rec, tokenizer, dataset.media_token_counts).ids)
                  for rec in dataset.records}
        for batch in make(args_, dataset, tokenizer, consumed, shuffle):
            if len(stamps) >= a.warmup:  # batches of the timed steps
                counts["real"] += sum(length[r] for r in batch["record_ids"])
                counts["computed"] += batch["tokens"].numel()
                counts["samples"] += len(batch["record_ids"])
            yield batch

    pretrain.batch_iterator = counted
    pretrain.pretrain(args, pretrain.TrainingCallbacks(
        on_step=lambda it, model, loss: stamps.append(time.perf_counter())))
    rank = int(os.environ["RANK"])
    with open(Path(a.out) / f"{a.mode}.{rank}.json", "w") as f:
        json.dump({"stamps": stamps, **counts}, f)
    torch.distributed.barrier()


def launch(a, mode: str, out: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(29500 + random.randrange(1000)), str(Path(__file__).resolve()),
           "--worker", "--mode", mode, "--data", str(a.data), "--out", out,
           *[f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
             if k in ("steps", "warmup", "micro_batch_size", "microbatches", "seq_length",
                      "img_size", "hidden_size")]]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{mode} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    ranks = [json.load(open(Path(out) / f"{mode}.{r}.json")) for r in range(2)]
    stamps = ranks[0]["stamps"]
    times = [b - a_ for a_, b in zip(stamps[a.warmup:], stamps[a.warmup + 1:])]
    # counts cover steps warmup+1 .. end (one more batch may be prefetched: ignore it)
    per_step = {k: sum(r[k] for r in ranks) / (len(stamps) - a.warmup)
                for k in ("real", "computed", "samples")}
    return {"step": statistics.median(times), **per_step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=2, help="micro-batches per step")
    p.add_argument("--seq-length", type=int, default=1024)
    p.add_argument("--img-size", type=int, default=16, help="16 px / patch 4: 16 tokens")
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--data", default=None, help="dataset dir (default: a fresh temp dir)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    with tempfile.TemporaryDirectory() as tmp:
        if a.data is None:
            a.data = Path(tmp) / "data"
            write_dataset(a.data, a.samples, a.img_size)
        runs = {m: [] for m in MODES}
        for _ in range(a.repeats):
            for mode in MODES:
                runs[mode].append(launch(a, mode, tmp))
    res = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    print(f"DP=2, {a.micro_batch_size} samples per micro-batch (mean, when balanced), "
          f"{a.microbatches} micro-batches per step, {a.steps} timed steps, "
          f"{a.repeats} run(s) per mode")
    print("| batching | step time (s) | samples / step | real tokens / step | "
          "computed tokens / step | time per 1k real tokens (s) |")
    print("|---|---|---|---|---|---|")
    for m in MODES:
        r = res[m]
        print(f"| {m} | {r['step']:.3f} | {r['samples']:.1f} | {r['real']:.0f} | "
              f"{r['computed']:.0f} | {1000 * r['step'] / r['real']:.4f} |")
    bal, rnd = res["isf-sorted"], res["none"]
    print(f"step time ratio balanced / random: {bal['step'] / rnd['step']:.3f}")
    print(f"step time ratio at equal real tokens per step (balanced / random): "
          f"{(bal['step'] / bal['real']) / (rnd['step'] / rnd['real']):.3f}")


if __name__ == "__main__":
    main()

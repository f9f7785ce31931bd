"""Step time with balanced batching vs random batching (DP=2), and with the workload-balanced
CP token assignment vs zigzag (CP=2), side by side in one run.

Writes a heterogeneous multimodal dataset, then trains the same tiny model on it with 2
processes (forked from one preloaded server: ``tools/local_ranks.py``) and the same flags
once per row, and prints per row: iteration time (median over the timed steps), real
tokens per second (pad excluded), samples, real and computed tokens (pad included) per
step, and the ratios to the row's baseline:

- ``dp2-random`` (``--data-balance none``: random micro-batches of ``--micro-batch-size``
  samples padded to their longest), baseline of ``dp2-balanced`` (``--data-balance
  isf-sorted``: packed, rank-balanced micro-batches of that many samples on average);
- ``cp2-zigzag`` (``--context-parallel-assignment zigzag``), baseline of ``cp2-balanced``
  (``ours``: blocks assigned by their attention work on the real mask), random batching.

A balanced step holds a few more samples (the bound search aims at [B, B + 1] per
micro-batch), so the figure to read is real tokens per second (the ratio of time per real
token, inverted).

``--family`` picks the data and the vision tower:

- ``vit`` (default; rows dp2-*): 1 to 4 fixed-size images per sample (a CLIP-style ViT),
  questions and answers of widely varying length;
- ``qwen2_5_vl`` (rows dp2-* and cp2-*): Qwen2.5-VL-shaped native-resolution data, 1 to 3
  images per sample whose sides are drawn independently from 28 px to ``--max-side``
  (multiples of 28: 1 to (max-side / 28)^2 / 4 LLM tokens each, so a sample's vision work
  varies 10-100x), through the Qwen2.5-VL tower (window attention, M-RoPE LLM);
- ``qwen3_vl`` (rows dp2-* and cp2-*): the same data with sides in multiples of 32 px
  (Qwen3-VL's merge unit), through the Qwen3-VL tower (attention over each whole image,
  so its cost grows with the square of each image's tokens; DeepStack from tower layer 0
  added after LLM layer 0; a Qwen3 LLM with interleaved M-RoPE).

    python tools/bench_balance.py                       # DP=2 on CPU (gloo)
    python tools/bench_balance.py --steps 40 --samples 1200 --repeats 2
    python tools/bench_balance.py --family qwen2_5_vl   # DP=2 and CP=2 rows
    python tools/bench_balance.py --family qwen3_vl

Runs alternate (A B C D, A B C D ...) so machine noise hits all; speed is never asserted
in tests.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tools"))
from local_ranks import run_ranks  # noqa: E402

# name -> (its baseline, its flags), in print order; every row runs on 2 processes.
ROWS = {
    "dp2-random": (None, ["--data-balance", "none"]),
    "dp2-balanced": ("dp2-random", ["--data-balance", "isf-sorted"]),
    "cp2-zigzag": (None, ["--context-parallel-size", "2",
                          "--context-parallel-assignment", "zigzag"]),
    "cp2-balanced": ("cp2-zigzag", ["--context-parallel-size", "2",
                                    "--context-parallel-assignment", "ours"]),
}
FAMILY_ROWS = {"vit": ["dp2-random", "dp2-balanced"], "qwen2_5_vl": list(ROWS),
               "qwen3_vl": list(ROWS)}
# The native-resolution families' merge unit (2 x 2 patches) side in pixels.
UNIT = {"qwen2_5_vl": 28, "qwen3_vl": 32}
WORDS = ("the chart shows a value of red blue green bar line axis year total sales mean "
         "document page table figure left right top bottom label answer question").split()


def model_flags(a) -> list:
    # Hidden size large against the sequence, as in real MLLMs (InternLM2-20B: 6144 vs
    # 6016-token packs): local-spec attention computes the whole packed S x S block and
    # masks it, so a tiny hidden size would measure that waste rather than the balance.
    flags = ["--num-layers", "2", "--hidden-size", str(a.hidden_size),
             "--ffn-hidden-size", str(4 * a.hidden_size), "--num-attention-heads", "4",
             "--group-query-attention", "--num-query-groups", "2",
             "--seq-length", str(a.seq_length), "--vision-hidden-size", str(a.hidden_size // 2),
             "--vision-num-layers", "2", "--vision-num-attention-heads", "4",
             "--transformer-impl", "local",
             "--lr", "1e-4", "--lr-decay-style", "constant", "--seed", "1234",
             "--micro-batch-size", str(a.micro_batch_size),
             "--global-batch-size", str(a.micro_batch_size * 2 * a.microbatches),
             "--context-parallel-block", str(max(8, a.seq_length // 16)),
             "--train-iters", str(a.warmup + a.steps), "--log-interval", str(a.warmup + a.steps),
             "--eval-interval", str(10 ** 6), "--skip-final-eval"]
    if a.family == "vit":
        return flags + ["--img-h", str(a.img_size), "--img-w", str(a.img_size),
                        "--patch-dim", "4", "--disable-vision-class-token"]
    half = a.hidden_size // 4 // 2  # M-RoPE sections split half the LLM head: t, h, w
    t = half // 4
    unit = UNIT[a.family]
    side = unit * (a.max_side // unit)
    flags += ["--vision-ffn-hidden-size", str(a.hidden_size),
              "--min-pixels", str(unit * unit), "--max-pixels", str(side * side),
              "--position-embedding-type", "mrope",
              "--mrope-section", str(t), str((half - t) // 2), str(half - t - (half - t) // 2)]
    if a.family == "qwen2_5_vl":
        return flags + ["--vision-model-type", "qwen2_5_vl", "--patch-dim", "14",
                        "--vision-window-size", "112", "--vision-fullatt-block-indexes", "1"]
    return flags + ["--vision-model-type", "qwen3_vl", "--patch-dim", "16",
                    "--vision-deepstack-visual-indexes", "0", "--mrope-interleaved",
                    "--qk-layernorm"]


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
    _write_records(out, samples, 4, lambda rng: _png(rng, img_size), seed)


def _draw_records(samples: int, max_images: int, image, seed: int):
    """(file, index, question, answer, images) of ``_write_records``' records, drawn in
    its order: 1 to ``max_images`` images each (``image(rng)``), a question of 3-60 words
    and an answer of 1-40."""
    rng = random.Random(seed)
    for name, n in (("train.jsonl", samples), ("valid.jsonl", 8)):
        for i in range(n):
            k = rng.randint(1, max_images)
            human = "<image>\n" * k + _text(rng, 3, 60) + "?"
            answer = _text(rng, 1, 40)
            yield name, i, human, answer, [image(rng) for _ in range(k)]


def _write_records(out: Path, samples: int, max_images: int, image, seed: int) -> None:
    """``train.jsonl`` (``samples`` records) and ``valid.jsonl`` (8) of ``_draw_records``
    (``image(rng)``: one image's data URL)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, i, human, answer, images in _draw_records(samples, max_images, image, seed):
        if name not in files:
            files[name] = open(out / name, "w")
        files[name].write(json.dumps({
            "id": f"{name[:5]}-{i}",
            "conversations": [{"from": "human", "value": human},
                              {"from": "gpt", "value": answer}],
            "images": images}) + "\n")
    for f in files.values():
        f.close()


def _flat_png(w: int, h: int, colour: tuple) -> str:
    """A one-colour ``w`` x ``h`` image (a few hundred bytes: only its size matters)."""
    from PIL import Image

    img = Image.new("RGB", (w, h), colour)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# Images per sample of the native-resolution data (1 to this many).
NATIVE_MAX_IMAGES = 3


def _native_image(rng: random.Random, max_side: int, unit: int = 28) -> tuple:
    """One native-resolution image: (width, height, colour), the sides drawn
    independently from ``unit`` px to ``max_side`` in steps of ``unit`` (the merge unit's
    side: the processor keeps them, multiples of it within the pixel bounds)."""
    sides = range(unit, max_side + 1, unit)
    w, h = rng.choice(sides), rng.choice(sides)
    return w, h, tuple(rng.randrange(256) for _ in range(3))


def write_native_resolution_dataset(out: Path, samples: int, max_side: int,
                                    seed: int = 0, unit: int = 28) -> None:
    """Qwen2.5-VL-shaped records: 1-3 images each (``_native_image``), a question of 3-60
    words and an answer of 1-40."""
    _write_records(out, samples, NATIVE_MAX_IMAGES,
                   lambda rng: _flat_png(*_native_image(rng, max_side, unit)), seed)


def native_resolution_image_sizes(samples: int, max_side: int, seed: int = 0) -> list:
    """The (width, height) of every image of each training record that
    ``write_native_resolution_dataset`` writes with these arguments, drawn the same way
    without writing them."""
    return [[(w, h) for w, h, _ in images] for name, _, _, _, images in _draw_records(
        samples, NATIVE_MAX_IMAGES, lambda rng: _native_image(rng, max_side), seed)
        if name == "train.jsonl"]


def worker(a) -> None:
    """One rank of one training run (``launch``): times steps, counts tokens."""
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    import megatron_mm.training.assembly.data_setup as data_setup
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import TrainingCallbacks
    from megatron_mm.data.processing import tokenize_record
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.initialize import shutdown_distributed

    args = parse_args(model_flags(a) + ["--data-path", str(a.data), *ROWS[a.row][1]])
    stamps, counts = [], {"real": 0, "computed": 0, "samples": 0}
    make = data_setup.batch_iterator

    def counted(args_, dataset, tokenizer, consumed, shuffle, *rest):
        length = {rec.id: len(tokenize_record(rec, tokenizer, dataset.media_token_counts).ids)
                  for rec in dataset.records}
        for batch in make(args_, dataset, tokenizer, consumed, shuffle, *rest):
            if len(stamps) >= a.warmup:  # batches of the timed steps
                counts["real"] += sum(length[r] for r in batch["record_ids"])
                counts["computed"] += batch["tokens"].numel()
                counts["samples"] += len(batch["record_ids"])
            yield batch

    data_setup.batch_iterator = counted
    pretrain(RunConfig.from_flags(args), TrainingCallbacks(
        on_step=lambda it, model, loss: stamps.append(time.perf_counter())))
    rank = int(os.environ["RANK"])
    with open(Path(a.out) / f"{a.row}.{rank}.json", "w") as f:
        json.dump({"stamps": stamps, **counts}, f)
    shutdown_distributed()


def launch(a, row: str, out: str) -> dict:
    """One row on 2 ranks (``local_ranks``: forked from one preloaded server)."""
    try:
        run_ranks(worker, 2, argparse.Namespace(**{**vars(a), "row": row, "out": out}),
                  env={"HF_HUB_OFFLINE": "1"})
    except RuntimeError as e:
        sys.exit(f"{row} run failed:\n{str(e)[-8000:]}")
    ranks = [json.load(open(Path(out) / f"{row}.{r}.json")) for r in range(2)]
    stamps = ranks[0]["stamps"]
    times = [b - a_ for a_, b in zip(stamps[a.warmup:], stamps[a.warmup + 1:])]
    # counts cover steps warmup+1 .. end (one more batch may be prefetched: ignore it);
    # the two CP ranks read the same micro-batches, the two DP ranks their own
    replicas = 2 if row.startswith("dp") else 1
    per_step = {k: sum(r[k] for r in ranks[:replicas]) / (len(stamps) - a.warmup)
                for k in ("real", "computed", "samples")}
    return {"step": statistics.median(times), **per_step}


def table(res: dict) -> list:
    """The printed rows: per row its figures and the ratios to its baseline."""
    lines = ["| row | baseline | iteration time (s) | real tokens / s | samples / step | "
             "real tokens / step | computed tokens / step | time / baseline | "
             "real tokens/s / baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        base = ROWS[name][0] or name
        b = res[base]
        rate, base_rate = r["real"] / r["step"], b["real"] / b["step"]
        lines.append(f"| {name} | {base} | {r['step']:.3f} | {rate:.0f} | "
                     f"{r['samples']:.1f} | {r['real']:.0f} | {r['computed']:.0f} | "
                     f"{r['step'] / b['step']:.3f} | {rate / base_rate:.3f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=2, help="micro-batches per step")
    p.add_argument("--seq-length", type=int, default=1024)
    p.add_argument("--img-size", type=int, default=16,
                   help="--family vit: 16 px / patch 4: 16 tokens")
    p.add_argument("--family", choices=sorted(FAMILY_ROWS), default="vit",
                   help="the data and vision tower (see above)")
    p.add_argument("--max-side", type=int, default=336,
                   help="--family qwen2_5_vl / qwen3_vl: the largest image side in pixels "
                        "(a multiple of 28 / 32)")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=None,
                   help="rows to run (default: the family's); a row brings its baseline")
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--data", default=None, help="dataset dir (default: a fresh temp dir)")
    a = p.parse_args()
    wanted = set(a.rows or FAMILY_ROWS[a.family])
    wanted |= {ROWS[r][0] for r in wanted if ROWS[r][0]}
    rows = [r for r in ROWS if r in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        if a.data is None:
            a.data = Path(tmp) / "data"
            if a.family == "vit":
                write_dataset(a.data, a.samples, a.img_size)
            else:
                write_native_resolution_dataset(a.data, a.samples, a.max_side,
                                                unit=UNIT[a.family])
        runs = {r: [] for r in rows}
        for _ in range(a.repeats):
            for r in rows:
                runs[r].append(launch(a, r, tmp))
    res = {r: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for r, rs in runs.items()}
    print(f"{a.family} data, 2 processes per row, {a.micro_batch_size} samples per "
          f"micro-batch (mean, when balanced), global batch "
          f"{a.micro_batch_size * 2 * a.microbatches} samples, {a.steps} timed steps, "
          f"{a.repeats} run(s) per row")
    print("\n".join(table(res)))


if __name__ == "__main__":
    main()

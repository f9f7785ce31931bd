"""Host memory and time of a checkpoint save, by the distributed optimizer's sharding type.

    python tools/bench_checkpoint.py [--hidden-size 384] [--num-layers 6]

DP=2 with ``--use-distributed-optimizer`` on 2 CPU ranks (gloo, forked from one preloaded
server: ``tools/local_ranks.py``), the digits data: one training step (Adam's state
exists), then the save at iteration 1 through the package's ``save_checkpoint``, for each
row in a fresh pair of processes:

- ``dp_reshardable``: Megatron-LM's default and the package's (each rank writes its own
  shard of the optimizer state);
- ``fully_reshardable`` (``--dist-ckpt-optim-fully-reshardable``): the optimizer state
  gathered over the data-parallel ranks to every rank (``get_parameter_state_dp_zero(
  return_on_all_ranks=True)``) and written in model space;
- ``fully_reshardable`` ``mem_efficient`` (``--distrib-optim-fully-reshardable-mem-efficient``):
  gathered over gloo to the first data-parallel rank only.

Host bytes held during the save: the process's peak resident memory over the save (the
kernel's high-water mark, reset just before it: ``/proc/self/clear_refs``) less its
resident memory just before, per parameter of the rank's model (the TP x PP shard:
the whole model at DP=2), on the rank holding most. On CPU the weights and the
optimizer's own shards are host memory already (a GPU run copies what it writes to the
host too): the difference between the rows is what the sharding type gathers. Times are
wall-clock on a shared machine: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from local_ranks import run_ranks  # noqa: E402  (tools/, the script's folder)

ROWS = {
    "dp_reshardable (Megatron-LM's default, ours)": [],
    "fully_reshardable": ["--dist-ckpt-optim-fully-reshardable"],
    "fully_reshardable, mem-efficient": ["--dist-ckpt-optim-fully-reshardable",
                                         "--distrib-optim-fully-reshardable-mem-efficient"],
}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def model_flags(a) -> list:
    return ["--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size),
            "--ffn-hidden-size", str(4 * a.hidden_size), "--num-attention-heads", "4",
            "--seq-length", "64", "--vision-hidden-size", "64", "--vision-num-layers", "2",
            "--vision-num-attention-heads", "2", "--img-h", "16", "--img-w", "16",
            "--patch-dim", "4", "--projector-ffn-hidden-size", "128",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1",
            "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "1",
            "--skip-final-eval", "--use-distributed-optimizer", "--save-interval", "1"]


def worker(a, row: str, save: str, out: str) -> None:
    """One rank of one row: train a step, measure the save (``save_checkpoint``)."""
    import gc

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.loop import trainer
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig

    save_checkpoint, measured = trainer.save_checkpoint, {}

    def measuring(config, iteration, chunks, *args, **kwargs):
        if measured:  # the first save only
            return save_checkpoint(config, iteration, chunks, *args, **kwargs)
        gc.collect()
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident memory (VmHWM) starts again from now
        start = time.perf_counter()
        path = save_checkpoint(config, iteration, chunks, *args, **kwargs)
        measured.update(seconds=time.perf_counter() - start,
                        held_bytes=(_status_kb("VmHWM") - before) * 1024,
                        params=sum(p.numel() for c in chunks for p in c.parameters()))
        return path

    trainer.save_checkpoint = measuring
    args = parse_args(model_flags(a) + ["--data-path", str(a.data), "--save", save]
                      + ROWS[row])
    pretrain(RunConfig.from_flags(args))
    with open(f"{out}.{os.environ['RANK']}", "w") as f:
        json.dump(measured, f)


def run_row(a, row: str, tmp: Path) -> dict:
    out = tmp / f"row{list(ROWS).index(row)}"
    try:
        run_ranks(worker, 2, a, row, str(out) + ".ckpt", str(out), env={"HF_HUB_OFFLINE": "1"})
    except RuntimeError as e:
        sys.exit(f"{row} failed:\n{str(e)[-6000:]}")
    ranks = [json.load(open(f"{out}.{r}")) for r in range(2)]
    peak = max(ranks, key=lambda r: r["held_bytes"])
    return {"per_param": peak["held_bytes"] / peak["params"], "params": peak["params"],
            "seconds": max(r["seconds"] for r in ranks),
            "ranks": [r["held_bytes"] / r["params"] for r in ranks]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden-size", type=int, default=384)
    p.add_argument("--num-layers", type=int, default=6)
    p.add_argument("--data", default=None, help="the digits dataset (default: a temp dir)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if a.data is None:
            from megatron_mm.data.digits import prepare_digits
            a.data = tmp / "digits"
            prepare_digits(a.data)
        results = {row: run_row(a, row, tmp) for row in ROWS}
    base = results[next(iter(ROWS))]
    print(f"DP=2, distributed optimizer, {base['params']:,} parameters per rank (gloo, CPU)")
    print("| sharding type | host bytes / param held during the save (rank 0, rank 1) "
          "| save time (s) | bytes / param vs dp_reshardable | time vs dp_reshardable |")
    print("|---|---|---|---|---|")
    for row, r in results.items():
        ranks = ", ".join(f"{b:.2f}" for b in r["ranks"])
        print(f"| {row} | {r['per_param']:.2f} ({ranks}) | {r['seconds']:.2f} | "
              f"{r['per_param'] / max(base['per_param'], 1e-9):.1f}x | "
              f"{r['seconds'] / base['seconds']:.2f}x |")


if __name__ == "__main__":
    main()

"""tools/bench_lora.py at tiny sizes (one forked process): its byte counts against a hand
computation (fp32 Adam: 4 gradient bytes and 8 moment bytes per trainable parameter; LoRA's
trainable parameters r x (in + out) per adapted projection), and Llama-2-7B's counts."""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--steps 1 --warmup 0 --micro-batch-size 2 --seq-length 24 "
        "--vision-num-layers 1 --vision-hidden-size 32 --vision-num-attention-heads 2 "
        "--img-size 28 --patch-dim 14 --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 128 "
        "--vocab-size 1000 --lora-rank 4").split()


def test_bench_lora_counts_bytes_exactly():
    proc = run_tool(ROOT / "tools" / "bench_lora.py", *TINY, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        for setup in ("full fine-tuning", "LoRA rank 4"):
            if line.startswith(setup):
                rows[setup] = line[len(setup):].split()
    full, lora = rows["full fine-tuning"], rows["LoRA rank 4"]
    params, trainable = (int(v.replace(",", "")) for v in full[:2])
    assert params == trainable and (float(full[2]), float(full[3])) == (4.0, 8.0)
    # per LLM layer: q, k, v, o (64 -> 64, 64 -> 32, 64 -> 32, 64 -> 64), gate, up
    # (64 -> 128), down (128 -> 64)
    r, h, kv, f = 4, 64, 32, 128
    adapters = 2 * r * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + f) + (f + h))
    assert int(lora[1].replace(",", "")) == adapters
    assert int(lora[0].replace(",", "")) == params + adapters
    assert float(lora[3]) == pytest.approx(8.0 * adapters / (params + adapters), abs=1e-3)
    assert "Llama-2-7B: 6,738,415,616 parameters" in proc.stdout
    assert int(lora[5].replace(",", "")) == 32 * r * (4 * 8192 + 3 * (4096 + 11008))

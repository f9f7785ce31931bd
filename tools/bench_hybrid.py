"""Step time and peak memory: a hybrid LLM (Qwen3.5's Gated DeltaNet layers with one
gated full-attention layer in --linear-attention-freq) against the same model with every
layer full attention, at each sequence length.

Both are megatron_mm's GPTModel LLM at the same sizes (the hybrid's GDN heads cover the
same width as its attention heads), fed the same tokens, trained one step the same way
(forward, loss over every token, backward, Adam). Timed steps alternate hybrid / full so
that machine noise hits both alike. "step peak" is the extra memory a step needs on top of
the parameters and Adam's state (activations, temporaries): ``max_memory_allocated`` on
CUDA, peak RSS growth on CPU (``tools/bench_model.py``'s sampler). The full-attention
model's attention scores grow as S^2, the GDN layers' state as S: the ratios at 2K and 8K
show it. On CPU the GDN layers run the CPU stand-ins (upstream's torch chunked rule per
chunk of 64, a Python loop), on a GPU flash-linear-attention's kernels.

``--context-parallel-sizes 1 2`` adds context parallelism: each size runs in a world of
that many ranks (spawned; gloo on CPU with the machine's cores shared out, NCCL on one GPU
per rank), the causal sequence split by the training script's balanced assignment
(``--context-parallel-block``; on CPU every rank of every size gets the largest world's
share of the cores, so a CP=N rank is set against one process on as many cores), the
full-attention layers on the package's CP attention
and the GDN layers head-parallel (``models/linear_attention_cp.py``), the gradients
all-reduced over the CP ranks before Adam. Times and peaks are the busiest rank's; the
last table sets each model's CP=N rank against CP=1.

    python tools/bench_hybrid.py                      # 2K and 8K tokens, CP=1
    python tools/bench_hybrid.py --seq-lengths 8192 16384 --context-parallel-sizes 1 2
    python tools/bench_hybrid.py --seq-lengths 2048 8192 16384 --steps 5   # a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from megatron_mm.config import (LanguageModelConfig, LinearAttentionConfig,  # noqa: E402
                                MultimodalModelConfig)
from megatron_mm.startup import prepare_megatron_core  # noqa: E402

prepare_megatron_core()

from bench_model import PeakRSS, release_free_heap  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed  # noqa: E402

from megatron_mm.models import BuildSettings, build_model  # noqa: E402

MiB = 2**20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--seq-lengths", type=int, nargs="+", default=[2048, 8192])
    a("--steps", type=int, default=2, help="timed steps per model and length")
    a("--warmup", type=int, default=1)
    a("--num-layers", type=int, default=4)
    a("--hidden-size", type=int, default=256)
    a("--num-attention-heads", type=int, default=2)
    a("--kv-channels", type=int, default=128)
    a("--linear-attention-freq", type=int, default=4,
      help="the hybrid's layer i is full attention when (i + 1) %% N == 0")
    a("--linear-num-key-heads", type=int, default=2)
    a("--linear-num-value-heads", type=int, default=4)
    a("--linear-head-dim", type=int, default=64)
    a("--vocab-size", type=int, default=1024)
    a("--context-parallel-sizes", type=int, nargs="+", default=[1],
      help="a world of each size in turn (ranks spawned), the sequence split over its ranks")
    a("--context-parallel-block", type=int, default=128)
    return p


def model_config(args, seq: int, hybrid: bool) -> MultimodalModelConfig:
    la = LinearAttentionConfig(
        linear_attention_freq=args.linear_attention_freq,
        linear_key_head_dim=args.linear_head_dim, linear_value_head_dim=args.linear_head_dim,
        linear_num_key_heads=args.linear_num_key_heads,
        linear_num_value_heads=args.linear_num_value_heads) if hybrid else None
    lm = LanguageModelConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads, kv_channels=args.kv_channels,
        ffn_hidden_size=4 * args.hidden_size, seq_length=seq, qk_layernorm=True,
        rotary_percent=0.25, attention_output_gate=True, apply_layernorm_1p=True,
        untie_embeddings_and_output_weights=True, linear_attention=la)
    return MultimodalModelConfig(encoders={}, projectors={}, language=lm)


def init_world(rank: int = 0, world: int = 1, port: int = 0) -> bool:
    cuda = torch.cuda.is_available()
    if not torch.distributed.is_initialized():
        if not port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if cuda:
            torch.cuda.set_device(rank)
        torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=rank,
                                             world_size=world)
    parallel_state.initialize_model_parallel(context_parallel_size=world)
    model_parallel_cuda_manual_seed(1234)
    return cuda


@dataclasses.dataclass
class Run:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    tokens: torch.Tensor
    positions: torch.Tensor
    mask: object  # the CP split (ContextParallelMask), None at CP=1


def make_run(args, seq: int, hybrid: bool, device, cp: int = 1) -> Run:
    from megatron_mm.training.assembly.attention import AttentionSettings

    torch.manual_seed(0)
    settings = BuildSettings(context_parallel_size=cp)
    model = build_model(model_config(args, seq, hybrid), settings, {}).to(device)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab_size, (1, seq), generator=gen).to(device)
    positions = torch.arange(seq, device=device)[None]
    split = AttentionSettings({}, context_parallel_size=cp, block=args.context_parallel_block,
                              linear_attention=hybrid)
    mask = split.mask_for({"tokens": tokens}, device=device)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-4), tokens, positions, mask)


def step(run: Run, cuda: bool) -> float:
    start = time.perf_counter()
    loss = run.model(run.tokens, run.positions, labels=run.tokens, attention_mask=run.mask)
    (loss.float().sum() / run.tokens.shape[1]).backward()  # this rank's share of the mean
    if run.mask is not None:  # the CP ranks' gradients summed, as DDP does
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in run.model.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        torch.distributed.all_reduce(flat, group=run.mask.group)
        for g, summed in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(summed)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=False)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def step_peak(run: Run, cuda: bool) -> int:
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(run, cuda)
        return torch.cuda.max_memory_allocated() - base
    release_free_heap()
    with PeakRSS() as peak:
        step(run, cuda)
    return peak.delta


def measure(args, cp: int = 1, rank: int = 0, port: int = 0) -> list:
    """(seq, {kind: median step s}, {kind: step peak bytes}) per length, on this rank of a
    CP world of ``cp`` ranks."""
    cuda = init_world(rank, cp, port)
    if not cuda:  # every rank of every size the same cores: the largest world's share
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(args.context_parallel_sizes)))
    device = torch.device("cuda" if cuda else "cpu")
    rows = []
    for seq in args.seq_lengths:
        runs = {kind: make_run(args, seq, kind == "hybrid", device, cp)
                for kind in ("hybrid", "full")}
        for run in runs.values():  # warm-up; Adam's state exists from here on
            for _ in range(args.warmup):
                step(run, cuda)
        times = {kind: [] for kind in runs}
        for _ in range(args.steps):
            for kind, run in runs.items():
                times[kind].append(step(run, cuda))
        peaks = {kind: step_peak(run, cuda) for kind, run in runs.items()}
        rows.append((seq, {k: statistics.median(v) for k, v in times.items()}, peaks))
        del runs
    parallel_state.destroy_model_parallel()
    return rows


def _rank(rank: int, args, cp: int, port: int, out: str) -> None:
    warnings.filterwarnings("ignore")
    prepare_megatron_core()
    torch.save(measure(args, cp, rank, port), os.path.join(out, f"{rank}.pt"))
    torch.distributed.destroy_process_group()


def measure_world(args, cp: int) -> list:
    """``measure`` on ``cp`` spawned ranks; per length the busiest rank's time and peak."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(args, cp, port, out), nprocs=cp,
                           start_method="spawn", join=True)
        ranks = [torch.load(os.path.join(out, f"{r}.pt")) for r in range(cp)]
    return [(seq, {k: max(r[i][1][k] for r in ranks) for k in times},
             {k: max(r[i][2][k] for r in ranks) for k in peaks})
            for i, (seq, times, peaks) in enumerate(ranks[0])]


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    by_cp = {}
    for cp in args.context_parallel_sizes:
        by_cp[cp] = measure_world(args, cp) if cp > 1 else measure(args)
    cuda = torch.cuda.is_available()
    for cp, rows in by_cp.items():
        print_table(rows, args, cuda, cp)
    if len(by_cp) > 1:
        print_cp_table(by_cp, args)
    return by_cp


def print_table(rows, args, cuda, cp: int = 1) -> None:
    pattern = LinearAttentionConfig(linear_attention_freq=args.linear_attention_freq
                                    ).pattern(args.num_layers)
    where = "one process" if cp == 1 else (f"CP={cp} (the busiest of {cp} ranks, blocks of "
                                           f"{args.context_parallel_block})")
    print(f"\n{'CUDA' if cuda else 'CPU'} fp32, {args.num_layers} layers of "
          f"{args.hidden_size} (hybrid pattern {list(pattern)}: 1 GDN, 0 full attention; "
          f"{args.num_attention_heads} heads of {args.kv_channels}), batch 1, "
          f"median of {args.steps} steps, {where}")
    print("| tokens | hybrid step (s) | full step (s) | time full / hybrid | hybrid step peak "
          "(MiB) | full step peak (MiB) | memory full / hybrid |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for seq, t, m in rows:
        print(f"| {seq} | {t['hybrid']:.3f} | {t['full']:.3f} | {t['full'] / t['hybrid']:.2f} "
              f"| {m['hybrid'] / MiB:.0f} | {m['full'] / MiB:.0f} | "
              f"{m['full'] / max(m['hybrid'], 1):.2f} |")


def print_cp_table(by_cp: dict, args) -> None:
    """Each model's CP=N rank against CP=1: step time and step peak per rank."""
    base = {seq: (t, m) for seq, t, m in by_cp[1]} if 1 in by_cp else None
    if base is None:
        return
    print("\nper rank against CP=1 (time and step peak of the busiest rank / one process)")
    print("| tokens | CP | hybrid time | full time | hybrid memory | full memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    for cp, rows in by_cp.items():
        if cp == 1:
            continue
        for seq, t, m in rows:
            t1, m1 = base[seq]
            print(f"| {seq} | {cp} | {t['hybrid'] / t1['hybrid']:.2f} | "
                  f"{t['full'] / t1['full']:.2f} | {m['hybrid'] / max(m1['hybrid'], 1):.2f} | "
                  f"{m['full'] / max(m1['full'], 1):.2f} |")


if __name__ == "__main__":
    main()

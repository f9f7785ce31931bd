"""The GPU benchmark: megatron_mm with local layers (bf16), with Transformer Engine layers
(bf16 and FP8), and Megatron-Core's own LLaVAModel, at the same sizes, side by side.

One table, one row per configuration: step time (median), tokens/s, MFU and peak memory
per rank. Every row trains the same CLIP ViT -> MLP projector -> Llama-style LLM on the
same batch with the same Megatron-Core machinery (tools/bench_model.py: Float16Module,
DDP, get_megatron_optimizer Adam; a step is forward + backward + grad finalize +
optimizer step, CUDA-synchronised). All rows start from the same weights (the TE rows
under TE's names, ``models/te_names.py``), so the "last loss" column must agree up to the
precision of the row.

- ``local bf16``: ``--transformer-impl local`` (Megatron-Core's own layers).
- ``TE bf16``: ``--transformer-impl transformer_engine``.
- ``TE FP8``: TE with the training script's ``--fp8-*`` flags (default here: hybrid,
  delayed scaling, amax history 1024, max, on the LLM: the encoder's 257 tokens per image
  are no multiple of 16, FP8's alignment, so ViT and projector stay bf16, as frozen
  encoders usually do). Each step starts as a training step's first micro-batch
  (``set_is_first_microbatch``: TE re-casts the FP8 weights the optimizer changed). With
  ``--fp8-emulation`` the row runs the CPU emulation in the local layers instead.
- ``LLaVAModel``: ``megatron.core.models.multimodal.llava_model.LLaVAModel`` with the best
  specs here (TE on a GPU with TE, else local), bf16.

Rows that need TE and CUDA are skipped where either is missing, with the reason in the
table; the others run anywhere, so on a CPU this is a smoke test of the benchmark itself
(MFU needs the device's peak: known for H100/H200/A100, else ``--peak-tflops``).

Model FLOPs per step come from the planner's layer chain (``plan/costs/flops.py``: matmul FLOPs,
causal attention halved, the whole vocabulary in the output layer); MFU = model FLOPs /
(step time x world size x peak bf16 dense FLOP/s), FP8 rows against the bf16 peak too.

    python tools/bench_gpu.py                       # a GPU: all rows at the default sizes
    torchrun --nproc-per-node 8 tools/bench_gpu.py --tensor-model-parallel-size 2
    python tools/bench_gpu.py --rows local-bf16,llava-bf16 --steps 2 ...   # CPU smoke
    python tools/bench_gpu.py --rows te-fp8 --fp8-emulation --steps 2 ...  # the FP8 row
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/bench_model.py

import bench_model as bm  # noqa: E402  (sets up the path, the patches and Megatron-Core)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_mm.models import BuildSettings, build_model, model_chain  # noqa: E402
from megatron_mm.models.specs import transformer_engine_importable  # noqa: E402
from megatron_mm.models.te_names import is_module_state, to_te  # noqa: E402
from megatron_mm.plan.fp8 import parse_fp8_modules  # noqa: E402
from megatron_mm.training.cli.flag_factory import add_group  # noqa: E402
from megatron_mm.training.config.fp8_args import fp8_settings  # noqa: E402
from megatron_mm.training.config.groups import Fp8Args  # noqa: E402

ROWS = ("local-bf16", "te-bf16", "te-fp8", "llava-bf16")
TITLES = {"local-bf16": "megatron_mm, local, bf16", "te-bf16": "megatron_mm, TE, bf16",
          "te-fp8": "megatron_mm, TE, FP8 (LLM)", "llava-bf16": "megatron.core LLaVAModel"}
# bf16 dense peak FLOP/s by device name (NVIDIA's data sheets; H200 has H100's compute).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def parse_args(argv=None):
    p = bm.build_parser(__doc__.split("\n")[0])
    p.set_defaults(bf16=True)
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma-separated subset of {', '.join(ROWS)}")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's bf16 dense peak, for MFU (default: by device name)")
    add_group(p, Fp8Args, "FP8")  # the te-fp8 row's settings: the training script's flags
    p.set_defaults(fp8="hybrid", fp8_amax_history_len=1024, fp8_amax_compute_algo="max")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    bad = [r for r in args.rows if r not in ROWS]
    if bad:
        p.error(f"--rows: unknown {', '.join(bad)}; choose from {', '.join(ROWS)}")
    return args


def te_missing() -> str:
    """Why the TE rows cannot run here ('' when they can)."""
    reasons = []
    if not transformer_engine_importable():
        reasons.append("Transformer Engine is not importable")
    if not torch.cuda.is_available():
        reasons.append("no CUDA device")
    return "; ".join(reasons)


def peak_flops(args, cuda: bool):
    if args.peak_tflops is not None:
        return args.peak_tflops * 1e12
    if cuda:
        name = torch.cuda.get_device_name()
        return next((v for k, v in PEAK_BF16.items() if k in name), None)
    return None


def model_flops_per_step(cfg, args, data_parallel: int) -> float:
    """Forward + backward FLOPs of one step over all ranks (TP = 1 chain: the whole model)."""
    chain = model_chain(cfg, seq_length=cfg.language.seq_length,
                        micro_batch_size=args.micro_batch_size)
    return data_parallel * sum(layer.total_flops for layer in chain)


def te_state(local_state: dict, te_model) -> dict:
    """Local weights under TE's names, TE's own module state kept."""
    state = {to_te(k): v for k, v in local_state.items() if not is_module_state(k)}
    own = te_model.state_dict()
    state.update({k: v for k, v in own.items() if is_module_state(k)})
    return state


def build_rows(args, cfg, cuda: bool, image_id: int):
    """(row, model or the reason it is skipped), every model from the same weights."""
    tp = args.tensor_model_parallel_size
    settings = lambda impl, fp8=None: BuildSettings(  # noqa: E731
        tensor_model_parallel_size=tp, transformer_impl=impl, bf16=args.bf16, fp8=fp8)
    reference = build_model(cfg, settings("local"), {"image": image_id})
    weights = reference.state_dict()
    missing = te_missing()
    fp8 = fp8_settings(args, parse_fp8_modules(args.fp8_modules, cfg.encoders))
    TITLES["te-fp8"] = (f"megatron_mm, local, FP8 emulation ({fp8_label(fp8)})"
                        if fp8.emulation else f"megatron_mm, TE, FP8 ({fp8_label(fp8)})")
    models = {}
    for row in args.rows:
        if row == "local-bf16":
            models[row] = reference
        elif row == "te-fp8" and fp8.emulation:  # the CPU numerics check, local layers
            model = build_model(cfg, settings("local", fp8), {"image": image_id})
            model.load_state_dict(weights, strict=True)
            models[row] = model
        elif row in ("te-bf16", "te-fp8"):
            if missing:
                models[row] = f"skipped: {missing}"
                continue
            model = build_model(cfg, settings("transformer_engine",
                                              fp8 if row == "te-fp8" else None),
                                {"image": image_id})
            model.load_state_dict(te_state(weights, model), strict=True)
            models[row] = model
        else:
            impl = "local" if missing else "transformer_engine"
            llava = bm.build_llava(cfg, settings(impl), image_id,
                                   reference.language_model.vocab_size)
            llava.load_state_dict(weights if impl == "local" else te_state(weights, llava),
                                  strict=True)
            models[row] = llava
            TITLES[row] = f"megatron.core LLaVAModel, {'local' if missing else 'TE'}, bf16"
    return models


def fp8_label(fp8) -> str:
    return ", ".join("LLM" if m == "llm" else m for m in fp8.modules)


def main(argv=None) -> list:
    args = parse_args(argv)
    cuda = bm.init_distributed(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tensor_model_parallel_size
    cfg = bm.model_config(args)
    image_id = args.vocab_size - 1
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    models = build_rows(args, cfg, cuda, image_id)
    (ours_in, ours_mask), (llava_in, _) = bm.make_batches(
        cfg, args.micro_batch_size, image_id, args.seed, device, args.answer_tokens)
    trainees = {}
    for row, model in models.items():
        if isinstance(model, str):
            continue
        inputs, mask = (llava_in, None) if row == "llava-bf16" else (ours_in, ours_mask)
        trainees[row] = bm.wrap(TITLES[row], model, args.bf16, cuda, inputs, mask)
    for i in range(args.warmup + args.steps):  # rows interleaved: noise hits all alike
        for t in trainees.values():
            elapsed = bm.train_step(t, cuda)
            if i >= args.warmup:
                t.times.append(elapsed)

    dp = world // tp
    tokens = dp * args.micro_batch_size * cfg.language.seq_length
    flops, peak = model_flops_per_step(cfg, args, dp), peak_flops(args, cuda)
    rows = []
    for row, model in models.items():
        if isinstance(model, str):
            rows.append(dict(row=TITLES[row], skipped=model))
            continue
        t = trainees[row]
        step = statistics.median(bm.reduce_max(t.times, cuda))
        mem = max(bm.step_peak_bytes(t, cuda) for _ in range(2)) + bm.static_bytes(t)
        (mem,) = bm.reduce_max([mem], cuda)
        rows.append(dict(row=TITLES[row], step_ms=1e3 * step, tokens_per_s=tokens / step,
                         mfu=flops / (step * world * peak) if peak else None,
                         peak_mib=mem / bm.MiB, loss=t.loss))
    if rank == 0:
        print_table(rows, args, cfg, world, tp, cuda, flops, peak)
    dist.barrier()
    bm.parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return rows


def print_table(rows, args, cfg, world, tp, cuda, flops, peak) -> None:
    enc, lm = cfg.encoders["vision"], cfg.language
    device = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"\n{device}; world {world} = TP {tp} x DP {world // tp}; "
          f"{'bf16' if args.bf16 else 'fp32'} params and activations; {args.steps} timed steps "
          f"after {args.warmup} warm-up, rows interleaved")
    print(f"per rank: {args.micro_batch_size} samples x {lm.seq_length} tokens "
          f"({enc.num_output_tokens} image tokens each); ViT {enc.num_layers}L "
          f"h{enc.hidden_size}; LLM {lm.num_layers}L h{lm.hidden_size} heads "
          f"{lm.num_attention_heads}/{lm.num_query_groups} ffn {lm.ffn_hidden_size} vocab "
          f"{lm.vocab_size}; model FLOPs per step {flops:.3e}; peak "
          + (f"{peak / 1e12:.0f} TFLOP/s bf16 dense" if peak else "unknown (MFU n/a)") + "\n")
    print("| row | step time (ms) | tokens/s | MFU | peak memory (MiB) | last loss |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['row']} | {r['skipped']} | | | | |")
            continue
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        print(f"| {r['row']} | {r['step_ms']:.3f} | {r['tokens_per_s']:.0f} | {mfu} | "
              f"{r['peak_mib']:.1f} | {r['loss']:.6f} |", flush=True)


if __name__ == "__main__":
    main()

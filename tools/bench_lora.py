"""Optimizer-state and gradient bytes per parameter, and step time: full fine-tuning vs LoRA.

Two copies of tools/bench_model.py's model (CLIP ViT -> MLP projector -> Llama-style LLM,
its default sizes unless given) train the same batch with the same Megatron-Core
machinery (DDP + get_megatron_optimizer Adam): one with every weight trainable, one with
LoRA adapters of ``--lora-rank`` on every linear of the LLM's attention and MLP (the
package's default targets) and everything else frozen. Bytes are counted exactly from the
tensors: the DDP gradient buffers, and the optimizer's state (Adam's two moments, plus
the fp32 master copies with --bf16); "per param" divides by all the model's parameters
(under TP, "trainable" and the bytes are rank 0's share, the parameters the whole model's).
The 7B row projects both onto Llama-2-7B's shapes (32 layers, hidden 4096, MLP 11008,
32 heads, vocabulary 32000, untied): the bytes each trainable parameter costs here, times
its trainable parameters (all of them; or r x (in + out) per adapted projection). Timed
steps alternate A B A B; the paired ratio is the median of per-pair ratios.

    python tools/bench_lora.py                  # CPU: noisy wall clock, exact bytes
    python tools/bench_lora.py --bf16 --steps 20
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_model as bm  # noqa: E402  (prepares Megatron-Core on import)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402

from megatron_mm.config import FreezeConfig, LoraConfig  # noqa: E402
from megatron_mm.models import BuildSettings, build_model  # noqa: E402
from megatron_mm.training.config.lora_args import TARGETS  # noqa: E402

MiB = 2 ** 20
LLAMA_7B = dict(layers=32, hidden=4096, ffn=11008, vocab=32000)


def llama_7b_params(rank: int):
    """(all parameters, LoRA parameters on q, k, v, o, gate, up, down) of Llama-2-7B."""
    h, f, n = LLAMA_7B["hidden"], LLAMA_7B["ffn"], LLAMA_7B["layers"]
    per_layer = 4 * h * h + 3 * h * f + 2 * h
    total = n * per_layer + 2 * LLAMA_7B["vocab"] * h + h
    lora = n * rank * (4 * (h + h) + 2 * (h + f) + (f + h))
    return total, lora


def state_bytes(t) -> tuple:
    """(gradient buffer bytes, optimizer state bytes) of a Trainee, exactly."""
    nbytes = lambda x: x.numel() * x.element_size()  # noqa: E731
    grads = sum(nbytes(b.grad_data) for b in t.ddp.buffers + t.ddp.expert_parallel_buffers)
    params = {id(p) for p in t.ddp.parameters()}
    state = 0
    for o in getattr(t.opt, "chained_optimizers", [t.opt]):
        for group in o.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in params:  # an fp32 master copy of a bf16 parameter
                    state += nbytes(p)
                state += sum(nbytes(s) for s in o.optimizer.state.get(p, {}).values()
                             if torch.is_tensor(s) and s.dim())  # not Adam's step count
    return grads, state


def trainable(model) -> int:
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    return sum(p.numel() for p in model.parameters()
               if p.requires_grad and param_is_not_tensor_parallel_duplicate(p))


def main(argv=None) -> dict:
    p = bm.build_parser(__doc__.split("\n")[0])
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    args = p.parse_args(argv)
    cuda = bm.init_distributed(args)
    impl = "local"  # LoRA's adapters hook Megatron-Core's local linears
    settings = BuildSettings(tensor_model_parallel_size=args.tensor_model_parallel_size,
                             transformer_impl=impl, bf16=args.bf16)
    full_cfg = bm.model_config(args)
    lora_cfg = dataclasses.replace(
        full_cfg, freeze=FreezeConfig(encoders={"vision"}, projectors={"vision"}),
        lora=LoraConfig(targets=(("language_model", TARGETS),), rank=args.lora_rank,
                        alpha=args.lora_alpha))
    image_id = args.vocab_size - 1
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    (inputs, mask), _ = bm.make_batches(full_cfg, args.micro_batch_size, image_id, args.seed,
                                        device, args.answer_tokens)
    models = {"full fine-tuning": build_model(full_cfg, settings, {"image": image_id}),
              f"LoRA rank {args.lora_rank}": build_model(lora_cfg, settings,
                                                         {"image": image_id})}
    counts = {name: (bm.count_params(m, device), trainable(m)) for name, m in models.items()}
    trainees = [bm.wrap(name, m, args.bf16, cuda, inputs, mask) for name, m in models.items()]
    for i in range(args.warmup + args.steps):  # A B A B ...
        for t in trainees:
            elapsed = bm.train_step(t, cuda)
            if i >= args.warmup:
                t.times.append(elapsed)
    times = [bm.reduce_max(t.times, cuda) for t in trainees]
    total_7b, lora_7b = llama_7b_params(args.lora_rank)
    rows = []
    for t, ts in zip(trainees, times):
        total, train = counts[t.name]
        grads, state = state_bytes(t)
        per_trainable = (grads + state) / train
        train_7b = total_7b if t is trainees[0] else lora_7b
        rows.append(dict(setup=t.name, params=total, trainable=train, grad_bytes=grads,
                         state_bytes=state, grad_per_param=grads / total,
                         state_per_param=state / total, median_ms=1e3 * statistics.median(ts),
                         trainable_7b=train_7b, gib_7b=per_trainable * train_7b / 2 ** 30,
                         per_param_7b=per_trainable * train_7b / total_7b, loss=t.loss))
    paired = statistics.median(b / a for a, b in zip(*times))
    if dist.get_rank() == 0:
        _print(rows, args, paired, total_7b, cuda)
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return {"rows": rows, "paired_ratio": paired, "llama_7b": (total_7b, lora_7b)}


def _print(rows, args, paired, total_7b, cuda) -> None:
    print(f"bench_lora: bench_model's model (ViT {args.vision_num_layers}x"
          f"{args.vision_hidden_size}, LLM {args.num_layers}x{args.hidden_size}), "
          f"{'bf16' if args.bf16 else 'fp32'}, {'CUDA' if cuda else 'CPU'}, "
          f"TP={args.tensor_model_parallel_size}, {args.steps} timed steps")
    head = (f"{'setup':<18} {'params':>10} {'trainable':>10} {'grad B/param':>13} "
            f"{'optim B/param':>14} {'step ms':>9} {'7B trainable':>13} "
            f"{'7B grad+optim GiB':>18} {'7B B/param':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['setup']:<18} {r['params']:>10,} {r['trainable']:>10,} "
              f"{r['grad_per_param']:>13.3f} {r['state_per_param']:>14.3f} "
              f"{r['median_ms']:>9.1f} {r['trainable_7b']:>13,} {r['gib_7b']:>18.2f} "
              f"{r['per_param_7b']:>11.3f}")
    print(f"Llama-2-7B: {total_7b:,} parameters; paired step-time ratio (LoRA / full, median "
          f"over {args.steps} pairs): {paired:.3f}", flush=True)


if __name__ == "__main__":
    main()

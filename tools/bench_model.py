"""Step time and peak memory: megatron_mm's MultimodalModel vs Megatron-Core's LLaVAModel.

Both models are built at the same sizes from the same TransformerConfigs and layer specs
(CLIP ViT with class token -> MLP projector -> Llama-style LLM: RMSNorm, SwiGLU, GQA, RoPE),
fed the same batch (each model in its own placeholder convention, so both run the same
image and text tokens), and trained with the same Megatron-Core machinery: DDP +
``finalize_model_grads`` + ``get_megatron_optimizer`` (Adam, clip-grad 1.0). A timed step is
forward + backward + grad finalize + optimizer step. Timed steps alternate A B A B so that
machine noise hits both models alike. LLaVA starts from our weights (same parameter names),
so both compute the same function: the "last loss" column must agree.

Memory per rank (max over ranks): "static" is parameters + grad buffers + optimizer state
(fp32 masters, Adam moments), counted exactly from the tensors; "step peak" is the extra
memory a step needs on top (activations, temporaries), measured in separate untimed steps:
``torch.cuda.max_memory_allocated`` on CUDA, peak RSS growth on CPU (a sampling thread plus
the kernel's reset-able VmHWM high-water mark). "peak memory" = static + step peak.

Run (CPU: gloo; CUDA: nccl; a plain process builds a 1-rank world itself):

    . .venv/bin/activate
    python tools/bench_model.py
    torchrun --nproc-per-node 2 tools/bench_model.py --tensor-model-parallel-size 2
    python tools/bench_model.py --bf16 --steps 20    # on a GPU, larger sizes: see --help

The CUDA branches (nccl, .cuda(), max_memory_allocated) have not been run yet: no GPU was
at hand when this was written; CPU fp32/bf16 at TP 1 and 2 were.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import socket
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
warnings.filterwarnings("ignore")  # megatron-core's missing-TE/Apex warnings, on every rank

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig  # noqa: E402
from megatron_mm.families.vit.config import VisionEncoderConfig  # noqa: E402
from megatron_mm.startup import prepare_megatron_core  # noqa: E402

prepare_megatron_core()  # before any megatron.core import

from megatron_mm.models import BuildSettings, build_model  # noqa: E402
from megatron_mm.models.specs import default_transformer_impl, get_layer_specs  # noqa: E402
from megatron_mm.models.transformer_configs import (  # noqa: E402
    language_transformer_config,
    projector_transformer_config,
)
from megatron_mm.families.vit.transformer_config import vision_transformer_config  # noqa: E402
from megatron_mm.runtime_patches import apply_cpu_patches  # noqa: E402

# CLIPViTModel defaults its ln_pre to torch.nn.LayerNorm without TE, which cannot be built;
# CUDA boxes without TE need this fix too (the patch set skips it when CUDA is present).
apply_cpu_patches(["clip_vit_norm"], force=True)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import (  # noqa: E402
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.models.multimodal.llava_model import LLaVAModel  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.tensor_parallel import (  # noqa: E402
    model_parallel_cuda_manual_seed,
    param_is_not_tensor_parallel_duplicate,
)

from megatron_mm.models.wrappers import DistributedDataParallel, Float16Module  # noqa: E402

MiB = 2**20


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def build_parser(description: str = __doc__.split("\n")[0]) -> argparse.ArgumentParser:
    """The model sizes and run flags (tools/bench_gpu.py adds its own to them)."""
    p = argparse.ArgumentParser(description=description)
    a = p.add_argument
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--micro-batch-size", type=int, default=2, help="samples per rank, one image each")
    a("--seq-length", type=int, default=512, help="LLM tokens per sample, image tokens included")
    a("--steps", type=int, default=10, help="timed steps per model")
    a("--warmup", type=int, default=2, help="untimed steps per model first")
    a("--bf16", action="store_true", help="Float16Module + fp32 master weights and grads")
    a("--transformer-impl", default=None, choices=("local", "transformer_engine"),
      help="layer specs for both models (default: TE when usable, else local)")
    a("--seed", type=int, default=1234)
    a("--answer-tokens", type=int, default=0,
      help="loss only on the last N tokens of each sample (SFT-style); 0: on all text")
    # ViT (CLIP: class token, ln_pre, quick-GELU)
    a("--vision-num-layers", type=int, default=4)
    a("--vision-hidden-size", type=int, default=256)
    a("--vision-num-attention-heads", type=int, default=4)
    a("--vision-ffn-hidden-size", type=int, default=None, help="default 4 x hidden")
    a("--img-size", type=int, default=224)
    a("--patch-dim", type=int, default=14)
    a("--disable-vision-class-token", action="store_true",
      help="drop the class token from the ViT output (both models)")
    # LLM (Llama-style)
    a("--num-layers", type=int, default=4)
    a("--hidden-size", type=int, default=512)
    a("--num-attention-heads", type=int, default=8)
    a("--num-query-groups", type=int, default=4)
    a("--ffn-hidden-size", type=int, default=1408)
    a("--vocab-size", type=int, default=32000)
    a("--untie-embeddings-and-output-weights", action=argparse.BooleanOptionalAction,
      default=True, help="Llama unties them (default); --no-untie-... ties them")
    return p


def init_distributed(args) -> bool:
    """torchrun's world, or a 1-rank one of our own; returns whether CUDA is used."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tensor_model_parallel_size)
    # As Megatron-LM's _set_random_seed: replicated weights drawn from the default generator
    # (ViT conv1, class token, ...) must come out the same on every TP rank.
    torch.manual_seed(args.seed)
    model_parallel_cuda_manual_seed(args.seed)
    return cuda


def model_config(args) -> MultimodalModelConfig:
    enc = VisionEncoderConfig(
        model_type="clip", hidden_size=args.vision_hidden_size,
        num_layers=args.vision_num_layers, num_attention_heads=args.vision_num_attention_heads,
        ffn_hidden_size=args.vision_ffn_hidden_size, img_h=args.img_size, img_w=args.img_size,
        patch_dim=args.patch_dim, drop_class_token=args.disable_vision_class_token)
    lm = LanguageModelConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
        ffn_hidden_size=args.ffn_hidden_size, seq_length=args.seq_length,
        untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights)
    return MultimodalModelConfig(encoders={"vision": enc}, language=lm)


def build_llava(cfg: MultimodalModelConfig, settings: BuildSettings, image_id: int,
                vocab_size: int):
    """Megatron-Core's LLaVAModel from the very TransformerConfigs and specs ours uses;
    ``vocab_size`` is our LLM's (already padded for TP, as Megatron-LM passes it)."""
    enc, lm = cfg.encoders["vision"], cfg.language
    specs = get_layer_specs(settings.transformer_impl)
    vision = vision_transformer_config(enc, settings)
    vision.vision_model_type = "clip"  # LLaVAModel reads it off the config (as Megatron-LM sets)
    return LLaVAModel(
        language_transformer_config=language_transformer_config(lm, settings),
        language_transformer_layer_spec=specs.language_layer,
        language_vocab_size=vocab_size,
        language_max_sequence_length=lm.max_position_embeddings,
        vision_transformer_config=vision,
        vision_transformer_layer_spec=specs.vision_layer,
        drop_vision_class_token=enc.drop_class_token,
        vision_projection_config=projector_transformer_config(
            cfg.projectors["vision"], lm, settings),
        vision_projection_layer_spec=specs.projector,
        vision_projection_type=cfg.projectors["vision"].projector_type,
        share_embeddings_and_output_weights=not lm.untie_embeddings_and_output_weights,
        language_position_embedding_type="rope",
        language_rotary_base=lm.rotary_base,
        img_h=enc.img_h, img_w=enc.img_w, patch_dim=enc.patch_dim,
        image_token_index=image_id,
    )


@dataclass
class Trainee:
    name: str
    ddp: DistributedDataParallel
    opt: object
    inputs: tuple  # (args, kwargs) of the forward call
    mask: torch.Tensor | None  # loss mask, or None when the model returns its own
    times: list
    loss: float = float("nan")


def wrap(name, model, bf16: bool, cuda: bool, inputs, mask) -> Trainee:
    """Megatron-LM's get_model + optimizer path: (cuda) -> Float16Module -> DDP -> Adam."""
    config = model.config
    if cuda:
        model.cuda(torch.cuda.current_device())
    if bf16:
        model = Float16Module(config, model)
    ddp = DistributedDataParallel(
        config=config, module=model,
        ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True))
    opt = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-5, weight_decay=0.01, clip_grad=1.0, bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32), [ddp])
    return Trainee(name, ddp, opt, inputs, mask, [])


def make_batches(cfg: MultimodalModelConfig, mbs: int, image_id: int, seed: int, device,
                 answer_tokens: int = 0):
    """One batch, two conventions: each sample is [bos, image, text...] with S tokens in all.

    Ours: the image already expanded to T = num_output_tokens placeholder ids.
    LLaVA: one ``image_token_index`` id that the model expands to T itself.
    """
    enc, S = cfg.encoders["vision"], cfg.language.seq_length
    T = enc.num_output_tokens
    if S < T + 2:
        raise SystemExit(f"--seq-length {S} must exceed the {T} image tokens + 1")
    # Same data on the ranks of a TP group, different across DP ranks.
    g = torch.Generator().manual_seed(seed + parallel_state.get_data_parallel_rank())
    text = torch.randint(0, image_id, (mbs, S - T + 1), generator=g)  # image_id not in text
    text[:, 1] = image_id
    images = torch.randn(mbs, 3, enc.img_h, enc.img_w, generator=g)

    def labels_and_mask(ids):  # next-token labels; nothing predicts or is an image token
        labels = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)
        mask = ((ids != image_id) & (labels != image_id)).float()
        mask[:, -1] = 0
        if answer_tokens:
            mask[:, :-answer_tokens - 1] = 0
        return labels, mask

    ours = torch.cat([text[:, :1], torch.full((mbs, T), image_id), text[:, 2:]], dim=1)
    ours_labels, ours_mask = labels_and_mask(ours)
    llava_labels, llava_mask = labels_and_mask(text)
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    ours, ours_labels, ours_mask, text, llava_labels, llava_mask, images = to(
        ours, ours_labels, ours_mask, text, llava_labels, llava_mask, images)
    pos = lambda ids: torch.arange(ids.shape[1], device=device).expand_as(ids)  # noqa: E731
    # Ours gets the loss mask as in training: its output layer runs only where the loss is.
    ours_inputs = ((ours, pos(ours)), dict(media={"image": images}, labels=ours_labels,
                                           loss_mask=ours_mask))
    # LLaVAModel(images, input_ids, position_ids, attention_mask, labels=, loss_mask=)
    llava_inputs = ((images, text, pos(text), None), dict(labels=llava_labels,
                                                          loss_mask=llava_mask))
    return (ours_inputs, ours_mask), (llava_inputs, None)


def train_step(t: Trainee, cuda: bool) -> float:
    """forward + backward + grad finalize (DP all-reduce) + optimizer step; seconds."""
    dist.barrier()  # start together, so one rank's tail is not the other's step time
    start = time.perf_counter()
    t.ddp.zero_grad_buffer()
    t.opt.zero_grad()
    t.ddp.set_is_first_microbatch()  # as Megatron-Core's forward_step: FP8 weights re-cast
    args, kwargs = t.inputs
    out = t.ddp(*args, **kwargs)
    loss, mask = (out, t.mask) if t.mask is not None else out  # LLaVA expands its own mask
    loss = (loss.float() * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()
    finalize_model_grads([t.ddp])
    t.opt.step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    t.loss = loss.item()
    return elapsed


class PeakRSS:
    """Peak resident-set growth over a block, on CPU.

    A thread samples RSS every 0.5 ms; where the kernel allows it, the VmHWM high-water mark
    is also reset (/proc/self/clear_refs "5") and read, which catches spikes between samples.
    """

    def __enter__(self):
        import psutil

        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._hwm = True
        except OSError:
            self._hwm = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self._hwm:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak = max(self.peak, int(line.split()[1]) * 1024)
        self.delta = self.peak - self.base


def release_free_heap() -> None:
    """Hand freed heap memory back to the OS (glibc), so the RSS baseline holds only live data.

    Otherwise a step reuses memory that earlier steps freed but glibc kept resident, and its
    RSS growth reads about half the real footprint (measured: 188 vs 395 MiB).
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the delta is then a lower bound
        pass


def step_peak_bytes(t: Trainee, cuda: bool) -> int:
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step(t, cuda)
        return torch.cuda.max_memory_allocated() - base
    release_free_heap()
    with PeakRSS() as m:
        train_step(t, cuda)
    return m.delta


def static_bytes(t: Trainee) -> int:
    """Exact bytes of parameters, DDP grad buffers and optimizer state (masters, moments)."""
    nbytes = lambda x: x.numel() * x.element_size()  # noqa: E731
    params = {id(p): p for p in t.ddp.parameters()}
    total = sum(nbytes(p) for p in params.values())
    total += sum(nbytes(b.grad_data) for b in t.ddp.buffers + t.ddp.expert_parallel_buffers)
    for o in getattr(t.opt, "chained_optimizers", [t.opt]):
        for group in o.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in params:  # an fp32 master copy of a bf16 parameter
                    total += nbytes(p)
                total += sum(nbytes(s) for s in o.optimizer.state.get(p, {}).values()
                             if torch.is_tensor(s))
    return total


def count_params(model, device) -> int:
    """Parameters of the whole model: TP shards summed, TP-replicated ones counted once."""
    n = sum(p.numel() for p in model.parameters() if param_is_not_tensor_parallel_duplicate(p))
    n = torch.tensor([n], dtype=torch.float64, device=device)
    dist.all_reduce(n, group=parallel_state.get_tensor_model_parallel_group())
    return int(n.item())


def reduce_max(values, cuda: bool) -> list:
    x = torch.tensor(values, dtype=torch.float64, device="cuda" if cuda else "cpu")
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x.tolist()


def main(argv=None) -> dict:
    args = parse_args(argv)
    cuda = init_distributed(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tensor_model_parallel_size
    impl = args.transformer_impl or default_transformer_impl()
    settings = BuildSettings(tensor_model_parallel_size=tp, transformer_impl=impl,
                             bf16=args.bf16)
    cfg = model_config(args)
    image_id = args.vocab_size - 1  # a real id: our model embeds the placeholder rows too
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    ours_model = build_model(cfg, settings, {"image": image_id})
    llava_model = build_llava(cfg, settings, image_id, ours_model.language_model.vocab_size)
    # Same parameter names (ours mirrors LLaVA's), so LLaVA can start from our weights: both
    # then compute the same function, and equal losses show they saw the same tokens.
    llava_model.load_state_dict(ours_model.state_dict(), strict=True)
    n_params = [count_params(m, device) for m in (ours_model, llava_model)]

    (ours_in, ours_mask), (llava_in, _) = make_batches(
        cfg, args.micro_batch_size, image_id, args.seed, device, args.answer_tokens)
    trainees = [wrap("megatron_mm MultimodalModel", ours_model, args.bf16, cuda, ours_in,
                     ours_mask),
                wrap("megatron.core LLaVAModel", llava_model, args.bf16, cuda, llava_in, None)]

    for i in range(args.warmup + args.steps):  # A B A B ...
        for t in trainees:
            elapsed = train_step(t, cuda)
            if i >= args.warmup:
                t.times.append(elapsed)

    times = [reduce_max(t.times, cuda) for t in trainees]  # a step lasts as its slowest rank
    rows = []
    for t, ts, n in zip(trainees, times, n_params):
        peak = max(step_peak_bytes(t, cuda) for _ in range(2))  # 2 tries: sampling can miss
        peak, static = reduce_max([peak, static_bytes(t)], cuda)
        rows.append(dict(model=t.name, params=n, median_ms=1e3 * statistics.median(ts),
                         min_ms=1e3 * min(ts), static_mib=static / MiB,
                         step_peak_mib=peak / MiB, peak_mib=(static + peak) / MiB, loss=t.loss))
    # Adjacent A/B steps share the machine's state, so the median of per-pair ratios is the
    # estimate most robust to load from other processes.
    paired = statistics.median(x / y for x, y in zip(*times))

    if rank == 0:
        print_table(rows, args, cfg, world, tp, impl, cuda)
        print(f"paired step-time ratio (median over the {args.steps} A/B pairs of ours / LLaVA): "
              f"{paired:.3f}", flush=True)
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return {"paired_ratio": paired, **{r["model"]: r for r in rows}}


def print_table(rows, args, cfg, world, tp, impl, cuda) -> None:
    enc, lm = cfg.encoders["vision"], cfg.language
    device = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"\n{device}; world {world} = TP {tp} x DP {world // tp}; "
          f"{'bf16' if args.bf16 else 'fp32'}; specs {impl}; optimizer: megatron-core DDP + "
          f"get_megatron_optimizer Adam; {args.steps} timed steps after {args.warmup} warm-up, "
          "interleaved ABAB")
    print(f"per rank: {args.micro_batch_size} samples x {lm.seq_length} tokens, of which "
          f"{enc.num_output_tokens} image tokens each ({enc.img_h}x{enc.img_w}/{enc.patch_dim}"
          f"{' + class token' if enc.num_output_tokens > enc.num_patches else ''}); "
          f"ViT {enc.num_layers}L h{enc.hidden_size}; LLM {lm.num_layers}L h{lm.hidden_size} "
          f"heads {lm.num_attention_heads}/{lm.num_query_groups} ffn {lm.ffn_hidden_size} "
          f"vocab {lm.vocab_size}")
    print("memory per rank, max over ranks; peak = static (params + grads + optimizer state, "
          f"exact) + step peak ({'max_memory_allocated' if cuda else 'RSS growth'})\n")
    cols = [("params", "params", "{:,}"), ("median_ms", "step time median (ms)", "{:.1f}"),
            ("min_ms", "min (ms)", "{:.1f}"), ("static_mib", "static (MiB)", "{:.1f}"),
            ("step_peak_mib", "step peak (MiB)", "{:.1f}"),
            ("peak_mib", "peak memory (MiB)", "{:.1f}"), ("loss", "last loss", "{:.6f}")]
    ratio = {"model": "ratio (ours / LLaVA)"}
    for key, _, _ in cols:
        a, b = rows[0][key], rows[1][key]
        ratio[key] = a / b if b else float("nan")
    print("| model | " + " | ".join(title for _, title, _ in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for row in rows:
        print(f"| {row['model']} | " + " | ".join(fmt.format(row[k]) for k, _, fmt in cols)
              + " |")
    print(f"| {ratio['model']} | " + " | ".join(f"{ratio[k]:.3f}" for k, _, _ in cols) + " |",
          flush=True)


if __name__ == "__main__":
    main()

"""OmniBal's ablation at this machine's scale: Megatron-Core's way, + balanced data,
+ partition search, + adaptive recompute, side by side (PP=2, gloo, CPU).

    python tools/bench_omnibal.py STATS [STATS ...] [--rounds 2] [--iters 4]

STATS: OmniBal's per-sample statistics (JSON lists, optionally gzip, of {"vit_num": tiles,
"token_num": tokens, "image_flags"}; files or directories of them, e.g. the four files of
InternVL-Chat-1.5's SFT mix). ``--samples`` records are drawn from them (seeded) and
synthesised as an InternVL dataset for a small InternVL-shaped model
(``--vision-model-type internvit``: InternViT, pixel shuffle, MLP projector, dynamic
tiling with ``--max-num-tiles 4`` and a thumbnail, the setting the statistics come from):

- tiles: each sample's image is sized with ``image_size_for_tiles`` so that the tiling
  cuts it into exactly the record's ``vit_num`` tiles (1, 3, 4 or 5), at ``--tile`` px
  tiles of ``--patch`` px patches instead of 448 / 14;
- tokens: a tile hands the LLM ``(tile / patch)^2 / 4`` tokens instead of 256 (16 at 32 /
  4 px), so every token count is divided by the same factor s = 256 / that (16): a
  record's LLM sequence is ``tiles x tokens per tile`` image tokens plus
  ``round(text / s)`` text tokens, text = ``token_num - 256 x vit_num`` (the chat template
  and the image markers included). The text is words of a word-level tokenizer (one token
  each) split between question and answer; the template's own 4 tokens (BOS, ``USER:``,
  ``ASSISTANT:``, EOS) count towards it, so a record whose scaled text is shorter gets the
  template plus a one-word answer (the achieved mean is printed beside the target).
  The ViT sees 4 x more tokens per tile than the LLM (65 vs 16 with the class token;
  InternVL-Chat-1.5: 1025 vs 256), and the ViT's width is half the LLM's over as many
  layers (InternViT-6B vs InternLM2-20B: 3200 vs 6144, 45 vs 48 layers), so the ViT does
  about half the work, as there.

Rows (each its own run of ``world = 2 x --data-parallel-size`` ranks, processes forked
from one preloaded server (``tools/local_ranks.py``), all from the same initial
checkpoint, the rows alternating A B C D A B C D ...):

1. Megatron-Core's way: ``--data-balance none`` (random micro-batches of
   ``--micro-batch-size`` samples, padded to their longest), ``--pipeline-partition
   uniform`` (the ViT and projector on stage 0), ``--recompute-granularity full
   --recompute-method uniform --recompute-num-layers 1`` (every layer recomputed);
2. + balanced data: ``--data-balance isf-sorted`` (packed, balanced on tiles and tokens
   across micro-batches and data-parallel ranks; ``--micro-batch-size`` samples per pack
   on average);
3. + partition search: ``--pipeline-partition search`` on a per-layer profile measured
   first (``tools/profile_layers.py`` on balanced micro-batches, ``--pipeline-profile``;
   the cost model alone would size the LLM at ``--seq-length`` tokens per sample and the
   ViT at one tile). Its first run searches; later rounds take the partition it chose;
4. + adaptive recompute: ``--recompute-memory-budget GB`` instead of full recompute, and
   the partition searched again under it (each candidate is timed with the recompute the
   budget leaves it: a layer moved off the fuller stage can buy that stage its recompute
   back); its first run searches, later ones take its pick. The budget (one figure for
   every rank, standing in for the device's memory; the package's own memory estimate,
   from the profile's saved bytes, on row 3's partition) is what the rank that needs the
   most holds without recompute: OmniBal's setting, where the device has room beyond what
   full recompute needs and the strategy fills it (at the seed's scale, 72 GB per A100
   holds the searched layout without recompute: ``python tools/plan.py --omnibal-table``);
5. the same with a tighter budget: halfway between no recompute and full recompute on
   that rank (never below what full recompute needs on any rank), so the budget binds and
   the adaptive choice keeps part of the recompute.

Per row: iteration time (median of the timed iterations after ``--warmup``, all rounds),
real tokens per second (padding excluded), both against row 1, the tokens computed per
iteration (padding included), each stage's recompute, peak memory per rank (the largest
over ranks of the process's max resident memory, which the training log reports on CPU,
in the last round, and of the bytes autograd holds for backward at their peak over one
more iteration, measured with tools/bench_recompute.py's saved-tensor hooks), and ``lm loss``
at iteration 1. Rows 2-5 train on the same data from the same weights, so their
iteration-1 losses must agree; one more 1-iteration run with row 1's data and row 4's
partition and budget checks row 1 the same way. The last lines give rows 5 and 4 against
row 1, ending with ``all three / megatron tokens per second: R``.

Each rank runs one thread pinned to a core: core = rank where there are enough cores,
else core = pipeline stage. The default is DP=1 (two ranks, one core each: every idle
moment is real). ``--data-parallel-size 2`` needs four cores to show the replicas'
imbalance; on two, both replicas of a stage share a core, which hides it (balanced data
then gains only from packing). Micro-batches are loaded before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tools"))  # the other benchmarks' helpers

from bench_balance import WORDS  # noqa: E402
from local_ranks import run_ranks, run_scripts  # noqa: E402

ROWS = ("megatron", "+ balanced data", "+ partition search", "+ adaptive recompute",
        "+ adaptive recompute, tighter memory")
FULL_RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]


# -- the data ------------------------------------------------------------------------------
def write_tokenizer(out: Path) -> Path:
    """A word-level tokenizer over the benchmark's words (one token per word): text token
    counts are then exact, and the output layer is small beside the layers, as in a real
    MLLM (a 32k vocabulary would dwarf a 256-wide LLM)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "</s>", "<pad>", "<image>", "USER",
                                         "ASSISTANT", ":", "?", *sorted(set(WORDS))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}))
    return out


def _png(size, rng: random.Random, path: Path) -> None:
    from PIL import Image

    h, w = size
    Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3)).save(path)


def _record(i: int, split: str, image: str, words: int, rng: random.Random) -> dict:
    answer = max(1, words // 2)
    question = words - answer
    text = " ".join(rng.choice(WORDS) for _ in range(question))
    return {"id": f"{split}-{i}", "images": [image],
            "conversations": [{"from": "human", "value": f"<image> {text}".strip()},
                              {"from": "gpt",
                               "value": " ".join(rng.choice(WORDS) for _ in range(answer))}]}


def synthesise(stats, out: Path, a) -> dict:
    """Draws ``a.samples`` records of the statistics and writes them as an InternVL
    dataset (train.jsonl, valid.jsonl, PNGs of the sizes that give each record's tiles).
    Returns the targets (per record: tiles, scaled tokens) and the scale."""
    from megatron_mm.families.internvl.work import read_all_internvl
    from megatron_mm.families.internvl.tiles import InternVLTiling, image_size_for_tiles

    real = InternVLTiling(max_tiles=4)  # the statistics' setting (checked per record)
    ours = InternVLTiling(tile_size=a.tile, patch_size=a.patch, max_tiles=4)
    works = read_all_internvl(stats, real)
    rng = random.Random(a.seed)
    drawn = rng.sample(works, min(a.samples, len(works)))
    scale = real.tokens_per_tile / ours.tokens_per_tile
    (out / "images").mkdir(parents=True, exist_ok=True)
    sizes = {}
    for w in drawn:
        if w.tiles not in sizes:
            sizes[w.tiles] = image_size_for_tiles(w.tiles, ours)
            _png(sizes[w.tiles], rng, out / "images" / f"t{w.tiles}.png")
    overhead = _template_tokens(out, a, drawn[0].tiles)
    targets, lines = [], []
    for i, w in enumerate(drawn):
        text = round(w.text_tokens / scale)
        words = max(1, text - overhead)
        targets.append({"tiles": w.tiles, "tokens": w.tiles * ours.tokens_per_tile + text,
                        "text": text, "words": words})
        lines.append(json.dumps(_record(i, "train", f"images/t{w.tiles}.png", words, rng)))
    (out / "train.jsonl").write_text("\n".join(lines) + "\n")
    (out / "valid.jsonl").write_text("\n".join(lines[:4]) + "\n")
    return {"scale": scale, "tokens_per_tile": ours.tokens_per_tile, "targets": targets,
            "overhead": overhead}


def _tokenised(a, data: Path):
    """The package's own tokenisation of a record (what training sees)."""
    from megatron_mm.data import build_tokenizer
    from megatron_mm.data.processing import tokenize_record
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.data_setup import media_processors
    from megatron_mm.training.config.run_config import RunConfig

    args = parse_args(model_flags(a, data, a.tokenizer_dir, 1), world_size=1)
    tok = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    counts = {m: p.token_count
              for m, p in media_processors(RunConfig.from_flags(args)).items()}
    return lambda rec: len(tokenize_record(rec, tok, counts).ids)


def _template_tokens(out: Path, a, tiles: int) -> int:
    """Tokens a record has beyond its image tokens and its words (BOS, the chat template,
    EOS), from a probe record of ``tiles`` tiles and two words."""
    from megatron_mm.data.records import parse_record
    from megatron_mm.families.internvl.tiles import InternVLTiling

    probe = _record(0, "probe", f"images/t{tiles}.png", 2, random.Random(0))
    for name in ("train.jsonl", "valid.jsonl"):  # the flags' check wants them (rewritten)
        (out / name).write_text(json.dumps(probe) + "\n")
    rec = parse_record(probe, base_dir=str(out))
    image = tiles * InternVLTiling(tile_size=a.tile, patch_size=a.patch).tokens_per_tile
    return _tokenised(a, out)(rec) - 2 - image


def achieved_tokens(data: Path, a) -> list:
    """Each training record's LLM tokens as the package tokenises them."""
    from megatron_mm.data.records import read_records

    count = _tokenised(a, data)
    return [count(rec) for rec in read_records(data / "train.jsonl")]


# -- the runs ------------------------------------------------------------------------------
def model_flags(a, data: Path, tokenizer: Path, world: int) -> list:
    dp = world // 2 if world > 1 else 1
    return ["--vision-model-type", "internvit", "--vision-hidden-size", str(a.hidden_size // 2),
            "--vision-num-layers", str(a.num_layers), "--vision-num-attention-heads", "4",
            "--img-h", str(a.tile), "--img-w", str(a.tile), "--patch-dim", str(a.patch),
            "--max-num-tiles", "4",
            "--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size),
            "--ffn-hidden-size", str(4 * a.hidden_size), "--num-attention-heads", "4",
            "--seq-length", str(a.seq_length), "--transformer-impl", "local",
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer),
            "--data-path", str(data), "--micro-batch-size", str(a.micro_batch_size),
            "--global-batch-size", str(a.micro_batch_size * dp * a.microbatches),
            "--lr", "1e-4", "--lr-decay-style", "constant", "--seed", "1234",
            "--train-iters", "1000", "--eval-interval", str(10 ** 6), "--skip-final-eval",
            "--log-interval", "1000"]


def row_flags(row: int, partition: str, memory) -> list:
    data = ["--data-balance", "none" if row == 0 else "isf-sorted"]
    part = ["--pipeline-partition", "uniform" if row < 2 else partition]
    recompute = (FULL_RECOMPUTE if row < 3 else ["--recompute-memory-budget",
                 f"{memory['budget' if row == 3 else 'tight']:.6f}"])
    return data + part + recompute


def worker(a, argv) -> None:
    """One rank of one run (``launch``): loads its micro-batches, times
    ``--iters`` iterations after ``--warmup``, then one more under saved-tensor hooks."""
    import torch

    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from bench_recompute import LiveSavedBytes
    from megatron_mm.training.loop.activation_profile import parameter_storages
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.initialize import shutdown_distributed
    from megatron_mm.training.pretrain import setup_training
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.step import real_tokens, train_step
    from megatron.core import parallel_state  # after megatron_mm (its import order)

    torch.set_num_threads(1)
    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cores = sorted(os.sched_getaffinity(0))
    stage = rank // (world // args.pipeline_model_parallel_size)  # Megatron's rank order
    os.sched_setaffinity(0, {cores[rank if len(cores) >= world else stage % len(cores)]})
    run = setup_training(RunConfig.from_flags(args))
    if args.save:  # the first run: its initial weights are every other run's
        run.save(0)
    else:
        run.load()
    m = args.num_microbatches
    source = run.batches(run.train_ds, 0, shuffle=True)
    batches = [next(source) for _ in range(m * (a.warmup + a.iters + 1))]
    timed = batches[m * a.warmup: m * (a.warmup + a.iters)]
    first_stage = parallel_state.is_pipeline_first_stage()
    tokens = sum(real_tokens(b) for b in timed) if first_stage else 0
    computed = sum(b["tokens"].numel() for b in timed) if first_stage else 0
    data = iter(batches)
    walls, losses = [], []
    for _ in range(a.warmup + a.iters):
        torch.distributed.barrier()
        start = time.perf_counter()
        result = train_step(run.config, run.model_chunks, run.optimizer, run.scheduler, data,
                            run.executor, run.attention)
        torch.distributed.barrier()
        walls.append(time.perf_counter() - start)
        losses.append(result.loss)
    tracker = LiveSavedBytes(parameter_storages(run.model_chunks))
    with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
        train_step(run.config, run.model_chunks, run.optimizer, run.scheduler, data,
                   run.executor, run.attention)
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, {
        "walls": walls[a.warmup:], "losses": losses, "tokens": tokens, "computed": computed,
        "saved_peak": tracker.peak, "stage": parallel_state.get_pipeline_model_parallel_rank(),
        # the training log's CPU memory figure (training_log.memory_report): peak RSS
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "layers": list(run.plan.partition.layers_per_chunk),
        "recompute": [_recomputed(args, n) for n in run.plan.recompute_num_layers]})
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(gathered, f)
    shutdown_distributed()


def _recomputed(args, n) -> str:
    """One chunk's recompute setting: Megatron's flags, or the budget's N per stack."""
    if isinstance(n, dict):
        return ", ".join(f"{stack} {k}" for stack, k in sorted(n.items()))
    if args.recompute_granularity is None:
        return "none"
    return f"{args.recompute_method} {n}"


def launch(a, argv: list, out: Path, iters: int, warmup: int) -> dict:
    """One run on ``a.world`` ranks (``local_ranks``: forked from one preloaded server)."""
    try:
        run_ranks(worker, a.world, argparse.Namespace(out=str(out), iters=iters,
                                                       warmup=warmup), list(argv),
                  env={"HF_HUB_OFFLINE": "1"})
    except RuntimeError as e:
        sys.exit(f"run failed: {' '.join(argv[-12:])}\n{str(e)[-20000:]}")
    ranks = json.loads(out.read_text())
    last = [r for r in ranks if r["stage"] == max(x["stage"] for x in ranks)]
    return {"walls": ranks[0]["walls"], "loss1": last[0]["losses"][0],
            "tokens": sum(r["tokens"] for r in ranks) / max(1, iters),
            "computed": sum(r["computed"] for r in ranks) / max(1, iters),
            "saved_peak": max(r["saved_peak"] for r in ranks),
            "max_rss_mb": max(r["max_rss_mb"] for r in ranks),
            "layers": ranks[0]["layers"], "recompute": " / ".join(ranks[0]["recompute"])}


def measure_profile(a, data: Path, out: Path) -> list:
    """Per-layer times and saved bytes of the whole model on balanced micro-batches, one
    process (tools/profile_layers.py): the ``--pipeline-profile`` rows 3 and 4 plan with
    (the partition search's anchor, the recompute budget's bytes). Without it the planner
    sizes the LLM at ``--seq-length`` tokens and the ViT at one tile per sample."""
    flags = model_flags(a, data, a.tokenizer_dir, 1) + ["--data-balance", "isf-sorted"]
    try:  # forked from the runs' preloaded server
        run_scripts(ROOT / "tools" / "profile_layers.py", [[*flags, "--profile-out", out]])
    except RuntimeError as e:
        sys.exit(f"profile_layers.py failed:\n{str(e)[-8000:]}")
    return ["--pipeline-profile", str(out)]


def recompute_budget(a, base: list, layers: list) -> dict:
    """GB per rank for rows 4 and 5 on the package's memory estimate (the one the budget
    is checked against) for ``layers``: what the rank that needs the most holds without
    recompute (row 4), and halfway between that and its full recompute, at least what
    full recompute needs on every rank (row 5)."""
    from megatron_mm.data import build_tokenizer
    from megatron_mm.plan import MemoryModel
    from megatron_mm.plan.pipeline.recompute_budget import GB, chunk_activations, static_bytes
    from megatron_mm.startup import prepare_megatron_core
    prepare_megatron_core()  # before any megatron.core import
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import model_config_for
    from megatron_mm.training.planning.training_plan import plan_pipeline

    args = parse_args(base + ["--pipeline-partition", ",".join(map(str, layers))],
                      world_size=a.world)
    tok = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    config = RunConfig.from_flags(args)
    plan = plan_pipeline(config, model_config_for(config, tok))
    part = plan.partition
    bounds = part.chunk_bounds()
    acts = chunk_activations(plan.chain, bounds, part.pipeline_model_parallel_size,
                             part.virtual_pipeline_model_parallel_size, args.num_microbatches)
    static = static_bytes(plan.chain, bounds, part.pipeline_model_parallel_size, MemoryModel())
    none = [static[c.rank] + c.bytes_with(0) for c in acts]
    full = [static[c.rank] + c.bytes_with(c.max_stack_layers) for c in acts]
    top = max(range(len(acts)), key=lambda i: none[i])
    tight = max(max(full), (none[top] + full[top]) / 2)
    return {"budget": none[top] / GB, "tight": tight / GB, "none": [b / GB for b in none],
            "full": [b / GB for b in full]}


# -- the driver ----------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stats", nargs="*", help="OmniBal statistics files or directories")
    p.add_argument("--samples", type=int, default=600, help="records drawn from the stats")
    p.add_argument("--rounds", type=int, default=2, help="runs of every row, alternating")
    p.add_argument("--iters", type=int, default=4, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8,
                   help="micro-batches per data-parallel rank per iteration")
    p.add_argument("--hidden-size", type=int, default=256, help="LLM; the ViT's is half")
    p.add_argument("--num-layers", type=int, default=4, help="of the LLM and of the ViT")
    p.add_argument("--tile", type=int, default=32, help="tile side in pixels")
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--search-candidates", type=int, default=3)
    p.add_argument("--search-iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="which records are drawn")
    a = p.parse_args(argv)
    if not a.stats:
        p.error("give the statistics files or directories")
    a.world = 2 * a.data_parallel_size
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        a.tokenizer_dir = write_tokenizer(work / "tokenizer")
        data = work / "data"
        synth = synthesise(a.stats, data, a)
        achieved = achieved_tokens(data, a)
        base = model_flags(a, data, a.tokenizer_dir, a.world) + [
            "--pipeline-model-parallel-size", "2",
            "--pipeline-search-candidates", str(a.search_candidates),
            "--pipeline-search-iters", str(a.search_iters)]
        profile = measure_profile(a, data, work / "profile.json")
        init = ["--save", str(work / "init")]  # the first run saves, the others load
        runs = {r: [] for r in range(len(ROWS))}
        # rows 3 and 4 search in their first run (row 4 under its budget: each candidate
        # timed with the recompute the budget leaves it), later runs take their pick
        partitions, memory = {2: "search", 3: "search", 4: "search"}, None
        for rnd in range(a.rounds):
            for row in range(len(ROWS)):
                if row == 3 and memory is None:
                    memory = recompute_budget(a, base + init + profile, runs[2][0]["layers"])
                flags = row_flags(row, partitions.get(row), memory)
                flags += profile if row >= 2 else []
                print(f"round {rnd + 1}, row {row + 1}: {' '.join(flags)}", file=sys.stderr,
                      flush=True)
                runs[row].append(launch(a, base + init + flags, work / "run.json", a.iters,
                                        a.warmup))
                init = ["--load", str(work / "init"), "--no-load-optim"]
                if partitions.get(row) == "search":
                    partitions[row] = ",".join(map(str, runs[row][0]["layers"]))
        stage_ms = profile_summary(work / "profile.json", {
            "uniform": runs[0][0]["layers"], "searched": runs[2][0]["layers"],
            "searched under the budget": runs[3][0]["layers"],
            "under the tighter budget": runs[4][0]["layers"]})
        check = launch(a, base + init + [
            "--data-balance", "none", "--pipeline-partition", partitions[3],
            "--recompute-memory-budget", f"{memory['budget']:.6f}", *profile],
            work / "check.json", 0, 1)
    report(a, synth, achieved, runs, check, memory, partitions, stage_ms)
    return 0


def profile_summary(path: Path, partitions: dict) -> dict:
    """Forward + backward ms per micro-batch of each chain layer, from the profile, and
    their sums per stage for each partition (what the search's anchor sees)."""
    from megatron_mm.plan.pipeline.profile import LayerProfile

    ms = [1e3 * (t.forward_s + t.backward_s) for t in LayerProfile.load(str(path)).layers]
    out = {"per layer": [round(x, 1) for x in ms]}
    for name, layers in partitions.items():
        out[name] = [round(sum(ms[:layers[0]]), 1), round(sum(ms[layers[0]:]), 1)]
    return out


def report(a, synth, achieved, runs, check, memory, partitions, stage_ms) -> None:
    targets = synth["targets"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    tiles = sorted({x["tiles"] for x in targets})
    print(f"{len(targets)} records drawn from {', '.join(map(str, a.stats))}: tiles "
          f"{ {t: sum(1 for x in targets if x['tiles'] == t) for t in tiles} }; "
          f"{a.tile} px tiles, {a.patch} px patches: {synth['tokens_per_tile']} LLM tokens per "
          f"tile (InternVL 256), all tokens scaled by 1/{synth['scale']:g}: mean LLM tokens "
          f"per record {mean([x['tokens'] for x in targets]):.1f} targeted, "
          f"{mean(achieved):.1f} achieved (template {synth['overhead']} tokens)")
    print(f"PP=2 x DP={a.data_parallel_size} ({a.world} ranks, {os.cpu_count()} cores), "
          f"ViT {a.num_layers} layers x {a.hidden_size // 2}, LLM {a.num_layers} layers x "
          f"{a.hidden_size}, {a.microbatches} micro-batches of {a.micro_batch_size} samples "
          f"per data-parallel rank; medians of {a.rounds} x {a.iters} iterations")
    print(f"partition search chose {partitions[2]} (chain layers per stage), under row 4's "
          f"budget {partitions[3]}, under row 5's {partitions[4]}; budgets {memory['budget']:.4f}"
          f" and {memory['tight']:.4f} GB per rank (package estimate per rank: no recompute "
          f"{[round(x, 4) for x in memory['none']]}, full {[round(x, 4) for x in memory['full']]})")
    print("| row | iteration s | vs 1 | real tokens / s | vs 1 | computed tokens / iter "
          "| recompute per stage (N) | max RSS MiB | peak saved act. MiB | lm loss it 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for row, name in enumerate(ROWS):
        rs = runs[row]
        step = statistics.median(w for r in rs for w in r["walls"])
        tps = statistics.median(r["tokens"] for r in rs) / step
        rows.append((step, tps))
        print(f"| {row + 1}. {name} | {step:.3f} | {step / rows[0][0]:.3f} | {tps:.0f} | "
              f"{tps / rows[0][1]:.3f} | {statistics.median(r['computed'] for r in rs):.0f} | "
              f"{rs[-1]['recompute']} | "
              f"{rs[-1]['max_rss_mb']:.0f} | "
              f"{max(r['saved_peak'] for r in rs) / 2 ** 20:.1f} | {rs[0]['loss1']:.6f} |")
    print("iteration s per run (median of its timed iterations), in launch order: " + "; ".join(
        f"row {row + 1}: " + ", ".join(f"{statistics.median(r['walls']):.3f}" for r in rs)
        for row, rs in runs.items()))
    print(f"profile, forward + backward ms per micro-batch of each chain layer: "
          f"{stage_ms['per layer']}; per stage: " + ", ".join(
              f"{name} {ms}" for name, ms in stage_ms.items() if name != "per layer"))
    same = [runs[r][0]["loss1"] for r in (1, 2, 3, 4)]
    spread = (max(same) - min(same)) / abs(same[0])
    print(f"iteration-1 lm loss, rows 2-5 (same data): {', '.join(f'{x:.6f}' for x in same)}"
          f" -> {'equal' if spread < 1e-5 else 'DIFFERENT'} (relative spread {spread:.1e})")
    d = abs(check["loss1"] - runs[0][0]["loss1"]) / abs(runs[0][0]["loss1"])
    print(f"iteration-1 lm loss, row 1 vs row 1's data with row 4's partition and budget: "
          f"{runs[0][0]['loss1']:.6f} vs {check['loss1']:.6f} -> "
          f"{'equal' if d < 1e-5 else 'DIFFERENT'} (relative {d:.1e})")
    print(f"all three, tighter memory (row 5) / megatron tokens per second: "
          f"{rows[4][1] / rows[0][1]:.3f}")
    print(f"all three / megatron tokens per second: {rows[3][1] / rows[0][1]:.3f}")


if __name__ == "__main__":
    sys.exit(main())

"""Pipeline partition planner: frozen-aware vs Megatron's uniform layout, with estimates.

For a model (a zoo pair or sizes on the command line), its freezing, PP / VPP and the
micro-batch count, prints the chosen partition stage by stage and the estimated iteration
time of Megatron-Core's uniform layout, the freeze-unaware balanced one and the
frozen-aware one. Pure Python: no torch, runs anywhere.

    python tools/plan.py --model-pair VLM-S --freeze-ViT --freeze-LM \\
        --pipeline-model-parallel-size 4 --num-microbatches 24 --recompute-granularity full
    python tools/plan.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\
        --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu \\
        --vocab-size 128256 --vision-num-layers 24 --vision-hidden-size 1024 \\
        --vision-num-attention-heads 16 --img-h 336 --img-w 336 --patch-dim 14 \\
        --freeze-ViT --freeze-LM --pipeline-partition 20,14,14,12
    python tools/plan.py --recipe qwen3_vl_8b_sft  # a recipe's model and layout (docs/recipes.md)
    python tools/plan.py --cornstarch-table        # the nine Cornstarch MLLMs
    python tools/plan.py --optimus-table           # Optimus' ViT + LLaMA / GPT models
    python tools/plan.py --optimus-schedule-table  # Optimus' encoder plan + bubble schedule
    python tools/plan.py --omnibal-table STATS_DIR  # OmniBal's ablation at its scale
    python tools/plan.py --qwen3-vl-moe-table  # Qwen3-VL-MoE: Megatron-Bridge vs the planner
    python tools/plan.py --placement-table  # colocated / bubble / separate encoder placements
    python tools/plan.py --qwen35-table  # Qwen3.5-27B's hybrid LLM: partitions that know
                                         # its Gated DeltaNet layers are O(S), and not
    python tools/plan.py --model-pair Qwen3.5-27B --pipeline-model-parallel-size 4 \
        --tensor-model-parallel-size 4 --seq-length 32768 --num-microbatches 32
    python tools/plan.py --model-pair Qwen3.5-27B --pipeline-model-parallel-size 4 \
        --tensor-model-parallel-size 4 --context-parallel-size 2 --seq-length 65536

The estimate's formula, the cost model and its assumptions are in megatron_mm/plan
(estimate.py, flops.py, layers.py). ``--json PATH`` writes the plan(s) as data.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron_mm.plan import (  # noqa: E402
    EncoderSpec, Hardware, MemoryModel, ModelSpec, PlanError, TransformerSpec, Workload,
    build_chain, describe_chunk, parse_partition_flag, plan_pipeline)
from megatron_mm.plan.context_parallel.hybrid import (  # noqa: E402
    gdn_cp_error, gdn_step_seconds, hybrid_cp_balance)
from megatron_mm.plan.model import (  # noqa: E402
    LinearAttentionSpec, linear_attention_pattern, patch_embed_flops)
from megatron_mm.plan.pipeline.profile import MEASURED, LayerProfile, apply_profile  # noqa: E402
from megatron_mm.reproductions import model_zoo  # noqa: E402
from megatron_mm.reproductions.comparison import (  # noqa: E402
    COMPARED, Scenario, compare, cornstarch_scenarios, optimus_scenarios)

GiB = 1024 ** 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to print")
    g.add_argument("--cornstarch-table", action="store_true",
                   help="uniform vs frozen-aware for Cornstarch's nine MLLMs (encoders and "
                        "LLM frozen, projectors trained)")
    g.add_argument("--optimus-table", action="store_true",
                   help="the same for Optimus' models, all trained and Cornstarch-frozen")
    g.add_argument("--optimus-schedule-table", action="store_true",
                   help="Optimus' runs (ViT-22B + GPT-175B on 1536 / 2048 / 3072 GPUs, "
                        "ViT-3B + GPT-11B on 8): simulated Megatron baseline vs the planned "
                        "encoder plan and bubble schedule, beside the paper's figures")
    g.add_argument("--qwen3-vl-moe-table", action="store_true",
                   help="Qwen3-VL-30B-A3B (8 H100) and 235B-A22B (256 H100): Megatron-"
                        "Bridge's published layouts with Megatron's schedule against the "
                        "layout and encoder schedule the planner picks (expert all-to-alls "
                        "charged), simulated tokens/s and the encoder share hidden")
    g.add_argument("--qwen35-table", action="store_true",
                   help="Qwen3.5-27B (hybrid Gated DeltaNet LLM) on 16 H100s: Megatron's "
                        "uniform partition, one blind to linear attention, the planner's")
    g.add_argument("--placement-table", action="store_true",
                   help="Optimus' models and Qwen3-VL-32B, light and heavy media, encoder "
                        "trained and frozen: Megatron-LM (encoder in the first stage), the "
                        "frozen-aware partition, the bubble plan and the best separate "
                        "placement (encoder ranks of their own) of a grid on the same GPUs, "
                        "simulated speed-ups over Megatron-LM, beside the published figures "
                        "of systems that place encoders on GPUs of their own")
    g.add_argument("--placement-gpus", type=int, nargs="+", default=None, metavar="N",
                   help="with --placement-table: only the setups on these GPU counts "
                        "(1536 8 64; default all)")
    g.add_argument("--optimus-gpus", type=int, nargs="+", default=None, metavar="N",
                   help="with --optimus-schedule-table: only the runs on these GPU counts "
                        "(1536 2048 3072 8; default all)")
    g.add_argument("--omnibal-table", nargs="+", default=None, metavar="STATS",
                   help="OmniBal's four rows (Megatron's way, + balanced data, + partition "
                        "search, + adaptive recompute) for InternViT-6B + InternLM2-20B on "
                        "A100s, simulated on the per-sample tile / token counts in these "
                        "files or directories (OmniBal's length statistics), beside the "
                        "paper's GPU-days; layout from --tensor-model-parallel-size (4), "
                        "--pipeline-model-parallel-size (4), --data-parallel-size (8), "
                        "--global-batch-size (1024), --micro-batch-size (4), "
                        "--memory-limit-gb (72)")
    g.add_argument("--json", default=None, help="write the plan(s) as JSON to this path")
    g.add_argument("--megatron-lm-args", action="store_true",
                   help="also print the flags that carry out the chosen partition in a stock "
                        "Megatron-LM run (--pipeline-model-parallel-layout, or the first / "
                        "last stage layer counts where they suffice, and the recompute "
                        "flags); the encoders must be on the first stage "
                        "(--pipeline-partition encoder-first-stage plans so)")

    g = p.add_argument_group("model: a zoo pair or sizes")
    g.add_argument("--model-pair", choices=sorted(model_zoo.PAIRS), default=None)
    g.add_argument("--num-layers", type=int)
    g.add_argument("--hidden-size", type=int)
    g.add_argument("--ffn-hidden-size", type=int, help="default 4 x hidden")
    g.add_argument("--num-attention-heads", type=int)
    g.add_argument("--group-query-attention", action="store_true")
    g.add_argument("--num-query-groups", type=int, default=1)
    g.add_argument("--kv-channels", type=int, default=None)
    g.add_argument("--swiglu", action="store_true", help="gated MLP (3 FFN matrices)")
    g.add_argument("--vocab-size", type=int)
    g.add_argument("--num-experts", type=int, default=1)
    g.add_argument("--moe-router-topk", type=int, default=1)
    g.add_argument("--attention-output-gate", action="store_true",
                   help="gated attention (Qwen3.5): the query projection also yields a gate")
    g.add_argument("--experimental-attention-variant", choices=["gated_delta_net"],
                   default=None, help="a hybrid LLM: Gated DeltaNet (linear attention) "
                                      "layers by --linear-attention-freq")
    g.add_argument("--linear-attention-freq", default="4",
                   help="N (every Nth layer full attention) or a 0/1 list per layer "
                        "(1: Gated DeltaNet), e.g. 1,1,1,0")
    la = LinearAttentionSpec()
    for name in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_num_key_heads", "linear_num_value_heads"):
        g.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(la, name))
    g.add_argument("--linear-attention-chunk-size", type=int, default=la.chunk_size,
                   help="the chunked delta rule's chunk (Megatron-Core's and FLA's: 64)")
    g.add_argument("--vision-num-layers", type=int, help="adds a ViT (with --vision-*)")
    g.add_argument("--vision-hidden-size", type=int)
    g.add_argument("--vision-ffn-hidden-size", type=int, help="default 4 x hidden")
    g.add_argument("--vision-num-attention-heads", type=int)
    g.add_argument("--patch-dim", type=int, default=14)
    g.add_argument("--disable-vision-class-token", action="store_true")
    g.add_argument("--images-per-sample", type=int, default=None,
                   help="images (tiles) per sample for a ViT given by sizes (default 1), "
                        "or 224 px images in --optimus-schedule-table (default 2)")
    g.add_argument("--img-h", type=int, default=None,
                   help="image height: a --vision-* ViT takes it whole (default 336); zoo "
                        "encoders tile it at their native resolution (default 720)")
    g.add_argument("--img-w", type=int, default=None, help="image width (default 336 / 1280)")
    g.add_argument("--audio-seconds", type=float, default=30.0, help="zoo audio encoders")

    g = p.add_argument_group("freezing (Megatron flags)")
    g.add_argument("--freeze-LM", action="store_true")
    g.add_argument("--freeze-ViT", action="store_true", help="freezes every encoder")
    g.add_argument("--freeze-projector", action="store_true")

    g = p.add_argument_group("parallelism and batch")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=None,
                   help="default 4 (tables: 4 for Cornstarch, Optimus' own per model)")
    g.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=None)
    g.add_argument("--tensor-model-parallel-size", type=int, default=None,
                   help="ideal division of FLOPs, weights and activations (default 1)")
    g.add_argument("--pipeline-partition", default="auto",
                   help="auto | uniform | balanced | search | encoder-first-stage | layers "
                        "per stage, e.g. 4,8,8,8")
    g.add_argument("--num-microbatches", type=int, default=None)
    g.add_argument("--global-batch-size", type=int, default=None)
    g.add_argument("--micro-batch-size", type=int, default=None, help="default 1")
    g.add_argument("--data-parallel-size", type=int, default=None, help="default 1")
    g.add_argument("--seq-length", type=int, default=None,
                   help="LLM tokens per sample, media included (default: text + media)")
    g.add_argument("--text-seq-length", type=int, default=1024,
                   help="text tokens when --seq-length is not given")
    g.add_argument("--recompute-granularity", choices=["full"], default=None)
    g.add_argument("--expert-model-parallel-size", type=int, default=1,
                   help="an MoE LLM's routed experts split over EP ranks (their all-to-alls "
                        "charged)")
    g.add_argument("--expert-tensor-parallel-size", type=int, default=None,
                   help="each expert's weights split over this many ranks (default: TP)")
    g.add_argument("--context-parallel-size", type=int, default=1,
                   help="CP ranks per LLM replica; a hybrid LLM's Gated DeltaNet layers run "
                        "head-parallel over TP x CP (checked), and its work and all-to-alls "
                        "per CP rank are printed (the stage table stays per whole sequence)")
    g.add_argument("--context-parallel-block", type=int, default=128,
                   help="tokens per block of the CP token assignment")

    g = p.add_argument_group("hardware and memory")
    g.add_argument("--peak-tflops", type=float, default=None,
                   help="default 989, H100 bf16 dense (--omnibal-table: 312, A100)")
    g.add_argument("--efficiency", type=float, default=0.5)
    g.add_argument("--p2p-bandwidth-gbps", type=float, default=None,
                   help="GB/s between neighbouring stages (default: transfers are free)")
    g.add_argument("--p2p-latency-us", type=float, default=0.0)
    g.add_argument("--memory-limit-gb", type=float, default=None,
                   help="GiB per GPU the partition must fit")
    g.add_argument("--bytes-per-trainable-param", type=float, default=16.0)
    g.add_argument("--bytes-per-trainable-expert-param", type=float, default=None,
                   help="a routed expert's (default: --bytes-per-trainable-param); the "
                        "distributed optimizer shards its state over the expert data-parallel "
                        "group")
    g.add_argument("--pipeline-profile", default=None, metavar="FILE",
                   help="measured per-layer times (tools/profile_layers.py) instead of FLOPs "
                        "and the hardware model; the sizes must describe the profiled model")
    return p


def recipe_flags(argv: Optional[Sequence[str]]) -> List[str]:
    """``--recipe NAME``: the recipe's model, freezing and layout as this tool's flags, then
    the other flags of ``argv`` (they win). Imports the package's training configs (torch):
    only with --recipe."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--recipe" not in argv:
        return argv
    i = argv.index("--recipe")
    name, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    from megatron_mm.startup import prepare_megatron_core

    prepare_megatron_core()  # the recipes import megatron_mm.training
    from megatron_mm.recipes import VOCAB_SIZES, WORLD_SIZES, get_recipe

    values = get_recipe(name).flags()
    v = values.get
    experts = v("num_experts") or 1
    model_parallel = (v("tensor_model_parallel_size") * v("pipeline_model_parallel_size")
                      * v("context_parallel_size"))
    out = {"num_layers": v("num_layers"), "hidden_size": v("hidden_size"),
           # an MoE layer's expert MLP (the planner's FFN with --num-experts)
           "ffn_hidden_size": v("moe_ffn_hidden_size") if experts > 1 else v("ffn_hidden_size"),
           "num_attention_heads": v("num_attention_heads"),
           "num_query_groups": v("num_query_groups") if v("group_query_attention") else None,
           "kv_channels": v("kv_channels"), "vocab_size": VOCAB_SIZES[name],
           "num_experts": experts,
           "moe_router_topk": v("moe_router_topk") if experts > 1 else None,
           "experimental_attention_variant": v("experimental_attention_variant"),
           "tensor_model_parallel_size": v("tensor_model_parallel_size"),
           "pipeline_model_parallel_size": v("pipeline_model_parallel_size"),
           "context_parallel_size": v("context_parallel_size"),
           "data_parallel_size": WORLD_SIZES[name] // model_parallel,
           "micro_batch_size": v("micro_batch_size"),
           "global_batch_size": v("global_batch_size"), "seq_length": v("seq_length"),
           "recompute_granularity": v("recompute_granularity")}
    ep = v("expert_model_parallel_size") or 1
    etp = v("expert_tensor_parallel_size") or v("tensor_model_parallel_size")
    if experts > 1:
        out.update(expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    if v("use_distributed_optimizer"):  # bf16 weights, fp32 grads; fp32 master + Adam over DP
        out["bytes_per_trainable_param"] = 6 + 12 / out["data_parallel_size"]
        if experts > 1:  # the experts' over the expert data-parallel group
            expert_dp = WORLD_SIZES[name] // (v("pipeline_model_parallel_size") * ep * etp)
            out["bytes_per_trainable_expert_param"] = 6 + 12 / expert_dp
    if v("experimental_attention_variant"):
        out.update({k: v(k) for k in ("linear_attention_freq", "linear_conv_kernel_dim",
                                      "linear_key_head_dim", "linear_value_head_dim",
                                      "linear_num_key_heads", "linear_num_value_heads")})
    if v("vision_model_type") != "none":
        out.update(vision_num_layers=v("vision_num_layers"),
                   vision_hidden_size=v("vision_hidden_size"),
                   vision_ffn_hidden_size=v("vision_ffn_hidden_size"),
                   vision_num_attention_heads=v("vision_num_attention_heads"),
                   patch_dim=v("patch_dim"))
        if v("vision_model_type") in ("clip", "internvit", "siglip"):  # fixed-size tiles
            out.update(img_h=v("img_h"), img_w=v("img_w"))
    flags = ["--swiglu"]  # the package's LLM: Llama-style, gated MLP
    for dest, value in out.items():
        if value is not None:
            flags += [f"--{dest.replace('_', '-')}", str(value)]
    switches = {"group_query_attention": v("group_query_attention"),
                "attention_output_gate": v("attention_output_gate"),
                "disable_vision_class_token": v("disable_vision_class_token"),
                # LoRA trains adapters only: the base LLM is frozen for the planner
                "freeze_LM": v("freeze_LM") or bool(v("lora_rank")),
                "freeze_ViT": v("freeze_ViT"), "freeze_projector": v("freeze_projector")}
    flags += [f"--{dest.replace('_', '-')}" for dest, on in switches.items() if on]
    return flags + rest


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    parser.add_argument("--recipe", default=None, metavar="NAME",
                        help="a recipe's model and layout (megatron_mm/recipes); the flags "
                             "given win")
    args = parser.parse_args(recipe_flags(argv))
    try:
        if args.omnibal_table:
            return print_omnibal_table(args)
        hardware = Hardware(peak_flops=(args.peak_tflops or 989.0) * 1e12,
                            efficiency=args.efficiency,
                            p2p_bandwidth=(args.p2p_bandwidth_gbps * 1e9
                                           if args.p2p_bandwidth_gbps else None),
                            p2p_latency_s=args.p2p_latency_us * 1e-6)
        memory = MemoryModel(bytes_per_trainable_param=args.bytes_per_trainable_param,
                             bytes_per_trainable_expert_param=(
                                 args.bytes_per_trainable_expert_param))
        limit = args.memory_limit_gb * GiB if args.memory_limit_gb else None
        if args.optimus_schedule_table:
            return print_schedule_table(args)
        if args.qwen3_vl_moe_table:
            from megatron_mm.reproductions.qwen3_vl_moe_scale import table as moe_table
            print("Qwen3-VL-MoE on H100 nodes, simulated (reproductions/qwen3_vl_moe_scale.py"
                  " says what is assumed): Megatron-Bridge's layouts against the planner's")
            print("\n".join(moe_table()))
            return 0
        if args.qwen35_table:
            from megatron_mm.reproductions.qwen3_5_scale import table as qwen35_table
            print("Qwen3.5-27B on 16 H100s (TP 4, PP 4), simulated (reproductions/"
                  "qwen3_5_scale.py says what is assumed): partitions of the hybrid LLM")
            print("\n".join(qwen35_table()))
            return 0
        if args.placement_table:
            return print_placement_table(args)
        if args.cornstarch_table or args.optimus_table:
            return print_tables(args, hardware, memory, limit)
        return print_plan(args, hardware, memory, limit)
    except PlanError as e:
        parser.error(str(e))
    return 2


# -- one model -------------------------------------------------------------------------

def model_from_args(args) -> ModelSpec:
    if args.model_pair:
        model = model_zoo.model_pair(args.model_pair, args.img_h or 720, args.img_w or 1280,
                                     args.audio_seconds)
    else:
        missing = [f"--{n.replace('_', '-')}" for n in
                   ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
                   if getattr(args, n) is None]
        if missing:
            raise PlanError(f"give --model-pair NAME or the model sizes; missing "
                            f"{', '.join(missing)}")
        llm = TransformerSpec(
            hidden_size=args.hidden_size, num_layers=args.num_layers,
            ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            num_query_groups=(args.num_query_groups if args.group_query_attention else None),
            kv_channels=args.kv_channels, gated_linear_unit=args.swiglu,
            num_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
            vocab_size=args.vocab_size, attention_output_gate=args.attention_output_gate,
            **linear_attention_from_args(args))
        encoders = [vit_from_args(args)] if args.vision_num_layers else []
        model = ModelSpec(name="command-line model", encoders=encoders, llm=llm)
    return model.with_freeze(args.freeze_ViT, args.freeze_projector, args.freeze_LM)


def linear_attention_from_args(args) -> dict:
    """Megatron-LM's Gated DeltaNet flags as TransformerSpec fields (none without
    --experimental-attention-variant)."""
    if args.experimental_attention_variant is None:
        return {}
    freq = args.linear_attention_freq
    try:
        freq = int(freq) if "," not in freq else [int(v) for v in freq.split(",")]
    except ValueError:
        raise PlanError(f"--linear-attention-freq must be an int or a 0/1 list, got "
                        f"{args.linear_attention_freq!r}") from None
    spec = LinearAttentionSpec(
        linear_conv_kernel_dim=args.linear_conv_kernel_dim,
        linear_key_head_dim=args.linear_key_head_dim,
        linear_value_head_dim=args.linear_value_head_dim,
        linear_num_key_heads=args.linear_num_key_heads,
        linear_num_value_heads=args.linear_num_value_heads,
        chunk_size=args.linear_attention_chunk_size)
    return dict(linear_attention=spec,
                linear_attention_freq=linear_attention_pattern(freq, args.num_layers))


def vit_from_args(args) -> EncoderSpec:
    if not (args.vision_hidden_size and args.vision_num_attention_heads):
        raise PlanError("--vision-num-layers needs --vision-hidden-size and "
                        "--vision-num-attention-heads")
    img_h, img_w, p = args.img_h or 336, args.img_w or 336, args.patch_dim
    if img_h % p or img_w % p:
        raise PlanError(f"--img-h/--img-w ({img_h}x{img_w}) must be divisible by "
                        f"--patch-dim ({p})")
    h = args.vision_hidden_size
    patches = (img_h // p) * (img_w // p)
    return EncoderSpec(
        name="vision", modality="vision",
        transformer=TransformerSpec(
            hidden_size=h, num_layers=args.vision_num_layers,
            ffn_hidden_size=args.vision_ffn_hidden_size or 4 * h,
            num_attention_heads=args.vision_num_attention_heads, add_bias_linear=True),
        tokens_per_item=patches + 1,
        llm_tokens_per_item=patches + (0 if args.disable_vision_class_token else 1),
        items_per_sample=args.images_per_sample or 1,
        embed_flops_per_token=patch_embed_flops(p, h),
        embed_params=(3 * p * p + patches + 2) * h)


def num_microbatches(args) -> int:
    if args.num_microbatches is not None:
        if args.global_batch_size is not None:
            raise PlanError("give --num-microbatches or --global-batch-size, not both")
        m = args.num_microbatches
    elif args.global_batch_size is not None:
        per = (args.micro_batch_size or 1) * (args.data_parallel_size or 1)
        if args.global_batch_size % per:
            raise PlanError(f"--global-batch-size ({args.global_batch_size}) must be a "
                            f"multiple of --micro-batch-size x --data-parallel-size ({per})")
        m = args.global_batch_size // per
    else:
        m = 24  # Cornstarch's harness
    if m < 1:
        raise PlanError("the number of micro-batches must be >= 1")
    return m


def print_omnibal_table(args) -> int:
    from megatron_mm.plan.balance.loads import read_all
    from megatron_mm.reproductions.omnibal_scale import ScaleSetup, run_ablation, table

    given = {"tensor_model_parallel_size": args.tensor_model_parallel_size,
             "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
             "data_parallel_size": args.data_parallel_size,
             "global_batch_size": args.global_batch_size,
             "micro_batch_size": args.micro_batch_size,
             "memory_budget_gb": args.memory_limit_gb}
    setup = ScaleSetup(**{k: v for k, v in given.items() if v is not None})
    hardware = Hardware(name="A100", peak_flops=(args.peak_tflops or 312.0) * 1e12,
                        efficiency=args.efficiency)
    ablation = run_ablation(read_all(args.omnibal_table), setup, hardware)
    print(table(ablation))
    if args.json:
        Path(args.json).write_text(ablation.to_json())
        print(f"\nwrote the ablation to {args.json}")
    return 0


def print_hybrid_layers(llm: TransformerSpec, chain) -> None:
    """A hybrid LLM's two layer kinds: how many, and each one's forward per micro-batch."""
    layers = [l for l in chain if l.kind == "llm_layer"]
    for linear, name in ((1, "Gated DeltaNet"), (0, "full attention")):
        mine = [l for i, l in enumerate(layers) if llm.is_linear(i) == bool(linear)]
        if mine:
            print(f"    {name:<15} x{len(mine):<3} {mine[0].fwd_flops / 1e12:.3f} TFLOP "
                  f"forward each (per TP rank)")


def check_context_parallel(args, llm: TransformerSpec) -> None:
    """--context-parallel-size's rules for this LLM, up front (PlanError naming the flag)."""
    cp = args.context_parallel_size
    if cp < 1 or args.context_parallel_block < 1:
        raise PlanError("--context-parallel-size and --context-parallel-block must be >= 1")
    if cp > 1 and llm.linear_attention is not None:
        error = gdn_cp_error(llm.linear_attention, args.tensor_model_parallel_size or 1, cp)
        if error:
            raise PlanError(error)


def print_hybrid_context_parallel(args, llm: TransformerSpec, seq: int,
                                  micro_batch_size: int, recompute: bool) -> None:
    """A hybrid LLM at CP > 1: one micro-batch's work per CP rank (a causal mask, the
    runtime's token assignment) and its Gated DeltaNet all-to-alls, timed on H100 links."""
    from megatron_mm.plan.costs.hardware import H100_LINKS

    cp, tp = args.context_parallel_size, args.tensor_model_parallel_size or 1
    codes = [[0] * seq] * micro_batch_size  # causal rows
    b = hybrid_cp_balance(llm, codes, cp, "ours", args.context_parallel_block,
                          tensor_model_parallel_size=tp)
    links = H100_LINKS
    inside = tp * cp <= links.gpus_per_node
    bandwidth = links.tp_bandwidth if inside else links.dp_bandwidth
    latency = links.tp_latency_s if inside else links.p2p_latency_s
    seconds = gdn_step_seconds(b, bandwidth, latency, recompute)
    print(f"context parallelism {cp} (TP {tp}): tokens per rank {b.tokens} of {seq} x "
          f"{micro_batch_size} rows; forward work max/mean: attention "
          f"{b.imbalance('attention_flops'):.3f}, whole LLM {b.imbalance():.3f}")
    print(f"  Gated DeltaNet x{b.gdn_layers}: heads {llm.linear_attention.linear_num_key_heads}"
          f" key / {llm.linear_attention.linear_num_value_heads} value split over TP x CP; "
          f"all-to-alls {b.a2a_bytes / 2 ** 20:.1f} MiB per layer forward on the busiest "
          f"rank, {b.step_a2a_bytes(recompute) / 2 ** 30:.2f} GiB per micro-batch "
          f"({seconds:.3f} s at {bandwidth / 1e9:g} GB/s, "
          f"{'NVLink' if inside else 'between nodes'})")


def print_plan(args, hardware: Hardware, memory: MemoryModel, limit) -> int:
    model = model_from_args(args)
    check_context_parallel(args, model.llm)
    media = model.media_tokens_per_sample
    seq = args.seq_length or args.text_seq_length + media
    workload = Workload(seq_length=seq, micro_batch_size=args.micro_batch_size or 1,
                        recompute=args.recompute_granularity == "full",
                        tensor_model_parallel_size=args.tensor_model_parallel_size or 1,
                        expert_model_parallel_size=args.expert_model_parallel_size,
                        expert_tensor_parallel_size=args.expert_tensor_parallel_size)
    chain = build_chain(model, workload)
    if args.pipeline_profile:
        chain = apply_profile(chain, LayerProfile.load(args.pipeline_profile))
        hardware = MEASURED
    pp = args.pipeline_model_parallel_size or 4
    vpp = args.virtual_pipeline_model_parallel_size or 1
    m = num_microbatches(args)
    chosen = parse_partition_flag(args.pipeline_partition)

    print(f"model: {model.name}")
    print(f"frozen: {freeze_words(model)}")
    print(f"workload: micro-batch {workload.micro_batch_size} x {seq} LLM tokens "
          f"({media} media), recompute {'full' if workload.recompute else 'off'}, "
          f"TP {workload.tensor_model_parallel_size}, {m} micro-batches; {hardware.name}"
          + ("" if hardware is MEASURED else f" at {hardware.peak_flops / 1e12:.0f} TFLOP/s "
             f"x {hardware.efficiency}"))
    print(f"chain: {len(chain)} layers; cost per layer in forwards F "
          f"(F + backward parts that run + recompute):")
    for kind, first in first_of_kind(chain):
        print(f"  {kind:<13} x{sum(l.kind == kind for l in chain):<3} "
              f"{first.total_flops / first.fwd_flops if first.fwd_flops else 0:.2f} F  "
              f"({why(first)})")
    if model.llm.linear_attention_freq and not args.pipeline_profile:
        print_hybrid_layers(model.llm, chain)
    if model.llm.linear_attention_freq and args.context_parallel_size > 1:
        print_hybrid_context_parallel(args, model.llm, seq, workload.micro_batch_size,
                                      workload.recompute)
    plan = plan_pipeline(chain, pp, vpp, chosen, m, hardware, memory, limit)
    print()
    print_stages(plan)
    print()
    print("| policy | layers per stage | iteration (s) | speedup vs uniform | peak GiB |")
    print("| --- | --- | --- | --- | --- |")
    rows = {}
    for policy in COMPARED:
        try:
            rows[policy] = plan_pipeline(chain, pp, vpp, policy, m, hardware, memory,
                                         limit if policy == "auto" else None)
        except PlanError as e:
            print(f"| {policy} | infeasible: {e} | | | |")
    if isinstance(chosen, list):
        rows["explicit"] = plan
    base = rows.get("uniform")
    for policy, p in rows.items():
        e = p.estimate
        speedup = f"{base.estimate.iteration_s / e.iteration_s:.2f}x" if base else "-"
        print(f"| {policy} | {counts(p)} | {e.iteration_s:.3f} | {speedup} | "
              f"{max(e.stage_memory_bytes) / GiB:.1f} |")
    if args.megatron_lm_args:
        print_megatron_lm_args(plan)
    if args.json:
        Path(args.json).write_text(plan.to_json(indent=1))
        print(f"\nwrote the {plan.partition.policy} plan to {args.json}")
    return 0


def print_megatron_lm_args(plan) -> None:
    from megatron_mm.plan.pipeline.megatron_lm_args import megatron_lm_args

    out = megatron_lm_args(plan.chain, plan.partition)
    print()
    print(f"Megatron-LM flags for the {plan.partition.policy} partition (LLM decoder layers "
          f"per chunk {out.decoder_layers_per_chunk}; encoders on the first stage):")
    print("  " + " ".join(out.flags()))
    if out.uneven_flags is not None:
        print("or, as Megatron-Core's layout:")
        print("  " + " ".join(out.layout_flags()))
    for note in out.notes:
        print(f"note: {note}")


def print_stages(plan) -> None:
    part, est = plan.partition, plan.estimate
    bounds = part.chunk_bounds()
    print(f"{part.policy} partition, PP {part.pipeline_model_parallel_size} x VPP "
          f"{part.virtual_pipeline_model_parallel_size}, {est.schedule}: iteration "
          f"{est.iteration_s:.3f} s (bubble {est.bubble_s:.3f} s, bottleneck stage "
          f"{est.bottleneck_stage})")
    print("| chunk | rank | layers | fwd ms | bwd ms | in flight | rank GiB | modules |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    pp = part.pipeline_model_parallel_size
    for c, (s, e) in enumerate(bounds):
        r, v = c % pp, c // pp
        print(f"| {c} | {r} | {e - s} | {est.chunk_forward_s[c] * 1e3:.1f} | "
              f"{est.chunk_backward_s[c] * 1e3:.1f} | {est.inflight_microbatches[r][v]} | "
              f"{est.stage_memory_bytes[r] / GiB:.1f} | {describe_chunk(plan.chain, s, e)} |")


def first_of_kind(chain):
    seen = {}
    for layer in chain:
        seen.setdefault(layer.kind, layer)
    return seen.items()


def why(layer) -> str:
    parts = ["trained" if layer.trainable else "frozen"]
    parts.append("input grads" if layer.needs_dgrad else "no input grads")
    if layer.recompute and layer.runs_backward:
        parts.append("recompute")
    return ", ".join(parts)


def freeze_words(model: ModelSpec) -> str:
    words = [f"encoders {model.frozen_encoders}" if model.frozen_encoders else "",
             f"projectors {model.frozen_projectors}" if model.frozen_projectors else "",
             "LLM" if model.freeze_llm else ""]
    return ", ".join(w for w in words if w) or "nothing"


def counts(plan) -> str:
    return ",".join(str(n) for n in plan.partition.layers_per_chunk)


# -- tables ----------------------------------------------------------------------------

def print_tables(args, hardware: Hardware, memory: MemoryModel, limit) -> int:
    overrides = {}
    for flag, key in (("pipeline_model_parallel_size", "pipeline_model_parallel_size"),
                      ("virtual_pipeline_model_parallel_size",
                       "virtual_pipeline_model_parallel_size"),
                      ("tensor_model_parallel_size", "tensor_model_parallel_size"),
                      ("num_microbatches", "num_microbatches"),
                      ("micro_batch_size", "micro_batch_size")):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    if args.recompute_granularity:
        overrides["recompute"] = True
    results = []
    if args.cornstarch_table:
        scenarios = cornstarch_scenarios(**overrides)
        s = scenarios[0]
        print(f"Cornstarch's nine MLLMs: encoders and LLM frozen, projectors trained, "
              f"recompute {'full' if s.recompute else 'off'}; Megatron chain PP "
              f"{s.pipeline_model_parallel_size} x VPP {s.virtual_pipeline_model_parallel_size}"
              f", TP {s.tensor_model_parallel_size}, {s.num_microbatches} micro-batches of "
              f"{s.micro_batch_size}; {s.text_tokens} text tokens + media ({s.img_w}x{s.img_h} "
              f"image, {s.audio_seconds:g} s audio); {hardware.peak_flops / 1e12:.0f} TFLOP/s "
              f"x {hardware.efficiency}")
        results += table(scenarios, hardware, memory, limit)
    if args.optimus_table:
        for trainable in (True, False):
            setting = ("everything trained" if trainable
                       else "encoders and LLM frozen, projectors trained")
            print(f"\nOptimus' models, {setting}; Megatron layouts of Optimus Appendix D "
                  "(PP, TP, M), micro-batch 2, "
                  f"2048 tokens incl. one 448x448 image, VPP 1, no recompute")
            results += table(optimus_scenarios(trainable, **overrides), hardware, memory,
                             limit)
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in results], indent=1))
        print(f"\nwrote {len(results)} comparisons to {args.json}")
    return 0


def print_schedule_table(args) -> int:
    """Optimus' settings and hardware are fixed by the paper
    (``reproductions/optimus_reference.py``); of the model flags only --images-per-sample
    applies (the paper does not give it)."""
    from megatron_mm.reproductions.optimus_reference import RUNS, table as optimus_schedule_table

    def gpus(run) -> int:
        lay = run.layout
        return (lay.pipeline_model_parallel_size * lay.tensor_model_parallel_size
                * lay.data_parallel_size)
    print("Optimus' encoder plan and bubble schedule, simulated (plan/encoder_planner.py): "
          "Megatron-LM puts the encoder in the first stage's chunk 0; the plan searches "
          "encoder PP / TP, pieces (layers, or attention / MLP kernels), placement order, "
          "coarse vs bubble schedule (pipeline, data-parallel and TP bubbles) and micro-batch "
          "size; the schedules' collectives (data-parallel reductions, encoder replicas' "
          "broadcast and sum) are charged; hidden = share of encoder work that does not "
          "lengthen the iteration")
    images = args.images_per_sample or 2  # the paper gives none; see optimus_reference
    print(f"{images} image(s) of 224 x 224 (256 tokens each) per 2048-token sample")
    runs = [r for r in RUNS if args.optimus_gpus is None or gpus(r) in args.optimus_gpus]
    if not runs:
        print(f"--optimus-gpus {args.optimus_gpus}: no Optimus run on those GPU counts "
              f"(they are {[gpus(r) for r in RUNS]})", file=sys.stderr)
        return 2
    lines, plans = optimus_schedule_table(runs, images_per_sample=images)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps([p.to_dict() for p in plans]))
        print(f"\nwrote {len(plans)} plans to {args.json}")
    return 0


def print_placement_table(args) -> int:
    """The setups, workloads and hardware are fixed (``reproductions/placement_scale.py``
    says what is assumed)."""
    from megatron_mm.reproductions.placement_scale import SETUPS, rows, table as placements

    setups = [s for s in SETUPS if args.placement_gpus is None or s.gpus in args.placement_gpus]
    if not setups:
        print(f"--placement-gpus {args.placement_gpus}: no setup on those GPU counts (they "
              f"are {[s.gpus for s in SETUPS]})", file=sys.stderr)
        return 2
    print("Encoder placements, simulated (reproductions/placement_scale.py): Megatron-LM "
          "(encoder in the first stage), frozen-aware partition, bubble plan (Optimus), "
          "separate (encoder ranks of their own, best of a grid on the same GPUs); "
          "(x) = samples/s over Megatron-LM's; encoder / bubble = encoder seconds per GPU "
          "over the LLM's own 1F1B idle seconds per GPU")
    results = rows(setups)
    print("\n".join(placements(results, setups)))
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in results]))
        print(f"\nwrote {len(results)} rows to {args.json}")
    return 0


def table(scenarios: List[Scenario], hardware, memory, limit):
    print("| pair | model | PP | M | LLM seq | uniform s | balanced s | frozen-aware s | "
          "speedup | vs balanced | uniform layers/stage | frozen-aware layers/stage | "
          "peak GiB u / a |")
    print("| --- " * 13 + "|")
    results = []
    for s in scenarios:
        r = compare(s, hardware, memory, limit)
        u, a = r.plans["uniform"], r.plans["auto"]
        print(f"| {s.pair} | {r.model_name.split(' (')[1].rstrip(')')} | "
              f"{s.pipeline_model_parallel_size} | {s.num_microbatches} | {r.seq_length} | "
              f"{r.iteration_s('uniform'):.2f} | {r.iteration_s('balanced'):.2f} | "
              f"{r.iteration_s('auto'):.2f} | {r.speedup:.2f}x | "
              f"{r.speedup_over_balanced:.2f}x | {counts(u)} | {counts(a)} | "
              f"{max(u.estimate.stage_memory_bytes) / GiB:.0f} / "
              f"{max(a.estimate.stage_memory_bytes) / GiB:.0f} |")
        results.append(r)
    speedups = [r.speedup for r in results]
    print(f"mean speedup over uniform {sum(speedups) / len(speedups):.2f}x, "
          f"max {max(speedups):.2f}x")
    return results


if __name__ == "__main__":
    sys.exit(main())

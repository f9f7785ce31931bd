"""Megatron-style command-line arguments, validated up front.

Flags keep Megatron-LM's names and meanings (``--tensor-model-parallel-size``,
``--freeze-LM``, ``--eval-iters`` ...); flags for new ideas follow the same style. No torch
import: a bad flag is reported before any process group exists.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Optional, Sequence

from ...config import ConfigError
from ...data.item_tags import TAG_TYPES
from ...families import FAMILIES, SLOTS, slot_families
from .data_args import add_data_args, validate_data_args
from ...plan.context_parallel.cp_assignment import BLOCK_OVERHEAD
from ...plan.pipeline.partition import parse_partition_flag
from .fp8_args import fp8_args, validate_fp8_args
from .fusion_args import add_fusion_args
from .linear_attention_args import CHECKPOINT_FLAGS as LINEAR_ATTENTION_FLAGS
from .linear_attention_args import add_linear_attention_args, check_gdn_context_parallel
from .logging_args import logging_args, validate_logging_args
from .model_config import build_model_config
from .lora_args import add_lora_args, lora_config, lora_flags_from_checkpoint
from .module_lr_args import add_module_lr_args, validate_module_lr_args
from .moe_args import (add_expert_parallel_args, add_moe_args,
                       refuse_moe_flags_given_to_dense, validate_moe_args)
from .separate_args import validate_separate, validate_separate_sizes
from .sequence_parallel import add_sequence_parallel_args, validate_sequence_parallel
from .transformer_impl import validate_transformer_impl
from .user_errors import ArgumentParser, exit_with_user_error


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("language model")
    g.add_argument("--num-layers", type=int, default=2)
    g.add_argument("--hidden-size", type=int, default=128)
    g.add_argument("--ffn-hidden-size", type=int, default=None)
    g.add_argument("--num-attention-heads", type=int, default=4)
    g.add_argument("--group-query-attention", action="store_true")
    g.add_argument("--num-query-groups", type=int, default=1)
    g.add_argument("--kv-channels", type=int, default=None,
                   help="attention head dimension (default: hidden size / heads)")
    g.add_argument("--seq-length", type=int, default=128)
    g.add_argument("--max-position-embeddings", type=int, default=None)
    g.add_argument("--rotary-base", type=float, default=10000.0)
    g.add_argument("--position-embedding-type", choices=["rope", "mrope", "yarn"],
                   default="rope",
                   help="mrope: Qwen2-VL's multimodal RoPE, rotating by 3-D (temporal, "
                        "height, width) position ids; yarn: YaRN's scaled RoPE "
                        "(Megatron-Core's YarnRotaryEmbedding)")
    g.add_argument("--mrope-section", type=int, nargs="+", default=None,
                   help="with mrope: rotary frequencies of the temporal, height and width "
                        "positions (three ints summing to --kv-channels / 2)")
    g.add_argument("--mrope-interleaved", action="store_true",
                   help="with mrope: deal the rotary frequencies to the temporal, height and "
                        "width positions in turn (Qwen3-VL) instead of in three sections")
    g.add_argument("--use-rope-scaling", action="store_true",
                   help="Apply rope scaling as used in llama3.x (Megatron-Core's: low / high "
                        "frequency factors 1 and 4, original context 8192)")
    g.add_argument("--rope-scaling-factor", type=float, default=8.0,
                   help="Rope scaling factor in llama3.x models")
    g.add_argument("--rotary-scaling-factor", type=float, default=1.0,
                   help="with yarn: the scaling factor (Hugging Face's rope_parameters "
                        "factor)")
    g.add_argument("--yarn-original-max-position-embeddings", type=int, default=None,
                   help="Original maximum position embeddings for YaRN RoPE frequency "
                        "correction (default 4096)")
    g.add_argument("--yarn-beta-fast", type=float, default=None,
                   help="Beta fast for YaRN RoPE frequency correction (default 32)")
    g.add_argument("--yarn-beta-slow", type=float, default=None,
                   help="Beta slow for YaRN RoPE frequency correction (default 1)")
    g.add_argument("--mscale", type=float, default=1.0,
                   help="with yarn: scales the concentration factor (0.1 * mscale * "
                        "ln(factor) + 1) applied to cos / sin")
    g.add_argument("--mscale-all-dim", type=float, default=0.0,
                   help="with yarn: the concentration factor is divided by 0.1 * "
                        "mscale_all_dim * ln(factor) + 1")
    g.add_argument("--yarn-correction-range-round-to-int", action="store_true", default=None,
                   help="Round YaRN correction range endpoints to integers (the default)")
    g.add_argument("--no-yarn-correction-range-round-to-int", action="store_false",
                   dest="yarn_correction_range_round_to_int",
                   help="Do not round YaRN correction range endpoints to integers")
    g.add_argument("--add-qkv-bias", action="store_true")
    g.add_argument("--qk-layernorm", action="store_true")
    add_linear_attention_args(g)  # Qwen3.5's hybrid LLM (linear_attention_args.py)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    g.add_argument("--norm-epsilon", type=float, default=1e-6)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument("--hidden-dropout", type=float, default=0.0)
    g.add_argument("--attention-dropout", type=float, default=0.0)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--transformer-impl", choices=["local", "transformer_engine"], default=None,
                   help="default: transformer_engine when TE and CUDA are available")
    g.add_argument("--attention-backend", choices=["flash", "fused", "unfused", "local", "auto",
                                                   "flex"], default="auto",
                   help="the LLM's attention kernel (Megatron-LM's; flex: FlexAttention for "
                        "every mask); auto: TE for causal masks, FlexAttention for the rest "
                        "on CUDA, the local path elsewhere (models/attention_choice.py)")
    g.add_argument("--use-cpu-initialization", action="store_true", default=None,
                   help="build full weights on the CPU then split (TP-independent init; "
                        "always on without CUDA)")

    g = vision_group = p.add_argument_group("vision encoder")
    g.add_argument("--vision-model-type", choices=slot_choices("vision"), default="clip",
                   help="the vision encoder's family (megatron_mm.families); none: a "
                        "language model only")
    g.add_argument("--vision-hidden-size", type=int, default=64)
    g.add_argument("--vision-num-layers", type=int, default=2)
    g.add_argument("--vision-num-attention-heads", type=int, default=4)
    g.add_argument("--vision-ffn-hidden-size", type=int, default=None)
    g.add_argument("--vision-feature-layer", type=int, default=-1)
    g.add_argument("--vision-norm-epsilon", type=float, default=None,
                   help="default: 1e-5 for clip, 1e-6 for siglip")
    g.add_argument("--img-h", type=int, default=28)
    g.add_argument("--img-w", type=int, default=28)
    g.add_argument("--patch-dim", type=int, default=7)
    g.add_argument("--disable-vision-class-token", action="store_true",
                   help="drop the class token from the encoder output (LLaVA does)")
    g.add_argument("--projector-type", choices=["mlp", "affine"], default="mlp")
    g.add_argument("--projector-ffn-hidden-size", type=int, default=None)
    g.add_argument("--image-token-id", type=int, default=None,
                   help="the image placeholder's token id (default: the tokenizer's own, "
                        "after its vocabulary)")
    g.add_argument("--image-tag-type", choices=TAG_TYPES, default="auto",
                   help="tokens around each image's (and video's) placeholder tokens "
                        "(Megatron-LM's flag): internvl <img> </img>, nvlm <Image> </Image>, "
                        "qwen-vl <|vision_start|> <|vision_end|>; none (or \"\"): no tags, for "
                        "records whose text carries them; auto: the encoder family's own "
                        "(InternVL's, Qwen2.5-VL's) where the tokenizer has those tokens. A "
                        "named style adds tokens a SentencePiece vocabulary lacks after it")

    g = p.add_argument_group("audio encoder")
    g.add_argument("--audio-model-type", choices=slot_choices("audio"), default="none",
                   help="whisper: a Whisper-style encoder (conv stem, sinusoidal positions, "
                        "pre-norm layers) as the \"audio\" encoder, fed <audio> clips")
    g.add_argument("--audio-hidden-size", type=int, default=64)
    g.add_argument("--audio-num-layers", type=int, default=2)
    g.add_argument("--audio-num-attention-heads", type=int, default=4)
    g.add_argument("--audio-ffn-hidden-size", type=int, default=None)
    g.add_argument("--audio-num-mel-bins", type=int, default=80)
    g.add_argument("--audio-max-source-positions", type=int, default=1500,
                   help="encoder frames after the stride-2 convolution; clips are padded to "
                        "twice this many 10 ms mel frames (Whisper: 1500 = 30 s) and longer "
                        "clips are refused")
    g.add_argument("--audio-pool-stride", type=int, default=1,
                   help="average-pool encoder frames by this factor (Qwen2-Audio: 2)")
    g.add_argument("--audio-norm-epsilon", type=float, default=1e-5)
    g.add_argument("--audio-projector-type", choices=["mlp", "affine"], default=None,
                   help="default: --projector-type")
    g.add_argument("--audio-token-id", type=int, default=None,
                   help="the audio placeholder's token id (default: the tokenizer's own)")
    groups = {"vision": vision_group, "audio": g}
    for fam in FAMILIES.values():  # each family's own flags, in its slot's group
        if fam.add_arguments is not None:
            fam.add_arguments(groups[fam.slot])

    g = p.add_argument_group("freezing")
    g.add_argument("--freeze-LM", action="store_true")
    g.add_argument("--freeze-ViT", action="store_true")
    g.add_argument("--freeze-audio", action="store_true",
                   help="freeze the audio encoder (its projector: --freeze-projector)")
    g.add_argument("--freeze-projector", action="store_true")
    add_lora_args(g)  # --lora-rank ...: adapters, their modules' base weights frozen


def _training_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1,
                   help="ranks sharing one sequence (any --media-attention mask; tokens "
                        "assigned by --context-parallel-assignment)")
    g.add_argument("--context-parallel-assignment", default="ours",
                   choices=["contiguous", "zigzag", "lpt", "ours"],
                   help="how tokens go to CP ranks: blocks by position (contiguous, zigzag) "
                        "or by their attention work (lpt; ours = LPT + local search)")
    g.add_argument("--context-parallel-block", type=int, default=128,
                   help="tokens per assignment block; shorter sequences than "
                        "block x CP size are not split")
    g.add_argument("--context-parallel-block-overhead", type=float, default=BLOCK_OVERHEAD,
                   help="fixed cost of one query block in the CP attention kernel, in "
                        "attention tiles, for the token assignment's load model (measure "
                        "with tools/bench_cp_attention.py --calibrate)")
    g.add_argument("--cp-comm-type", choices=["p2p", "a2a", "allgather", "a2a+p2p"],
                   default=None,
                   help="Megatron-Core's TE CP attention only (TE on CUDA, --transformer-impl "
                        "transformer_engine, causal mask, --context-parallel-assignment "
                        "zigzag), one type for every layer; default p2p there. Our CP "
                        "attention all-gathers K/V and rejects this flag")
    g.add_argument("--vision-dp-when-cp", action="store_true",
                   help="with --context-parallel-size > 1, each CP rank encodes a share of "
                        "the micro-batch's media items (every encoder's), balanced by their "
                        "vision work, and the features are all-gathered over the CP group "
                        "(their gradients reduce-scattered); default: every CP rank encodes "
                        "every item (Megatron-Bridge's vision_dp_when_cp)")
    g.add_argument("--media-attention", choices=["causal", "bidirectional"], default="causal",
                   help="how media tokens attend in the LLM: causally like text, or "
                        "bidirectionally within their own item (text stays causal)")
    g.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=None,
                   help="model chunks per pipeline rank (interleaved 1F1B)")
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    g.add_argument("--pipeline-partition", default="uniform",
                   help="which layers each pipeline stage holds: uniform (Megatron-Core: "
                        "encoders on the first stage, LLM layers split evenly), auto "
                        "(frozen-aware min-max over encoder, projector and LLM layers), "
                        "balanced (min-max as if everything trained), search (OmniBal: "
                        "time the best-ranked partitions near a greedy anchor, keep the "
                        "fastest), or layers per stage in chunk order, e.g. 6,4 "
                        "(tools/plan.py lists the chain)")
    g.add_argument("--pipeline-search-radius", type=int, default=1,
                   help="--pipeline-partition search: candidates move each stage boundary "
                        "of the anchor by up to this many layers")
    g.add_argument("--pipeline-search-candidates", type=int, default=3,
                   help="--pipeline-partition search: how many best-ranked candidates are "
                        "timed on the real model")
    g.add_argument("--pipeline-search-iters", type=int, default=3,
                   help="--pipeline-partition search: training iterations timed per "
                        "candidate (their median; the max over ranks)")
    g.add_argument("--memory-limit-gb", type=float, default=None,
                   help="memory per pipeline stage the partition must fit (the planner's "
                        "memory model: weights, gradients, optimizer state, in-flight "
                        "activations)")
    g.add_argument("--pipeline-profile", default=None, metavar="FILE",
                   help="measured per-layer times (tools/profile_layers.py) for "
                        "--pipeline-partition auto, instead of the FLOP cost model")
    g.add_argument("--encoder-schedule",
                   choices=["megatron", "coarse", "bubble", "separate", "auto"],
                   default="megatron",
                   help="megatron: Megatron-Core's schedules, encoders inside the pipeline "
                        "chunks that --pipeline-partition gives them; coarse: the encoder as "
                        "its own pipeline over the ranks, all its forwards before the LLM's "
                        "work and its backwards after; bubble: its pieces placed in the "
                        "LLM pipeline's bubbles (Optimus); separate: the encoders on ranks "
                        "of their own (--encoder-data-parallel-size), next to the LLM's "
                        "(planned and simulated; the training runtime refuses it yet); "
                        "auto: the one of megatron, coarse, bubble (and its "
                        "encoder PP and pieces) the simulator finds fastest on this run's "
                        "costs")
    g.add_argument("--encoder-pipeline-model-parallel-size", type=int, default=None,
                   help="encoder pipeline stages for --encoder-schedule coarse|bubble; "
                        "divides --pipeline-model-parallel-size (default: equal to it)")
    g.add_argument("--encoder-tensor-model-parallel-size", type=int, default=None,
                   help="the encoder layers' tensor parallelism with --encoder-schedule "
                        "coarse|bubble; divides --tensor-model-parallel-size (default: equal "
                        "to it). Smaller: each TP group holds TP / this many encoder "
                        "replicas, each running the encoder for its share of the "
                        "micro-batches. With separate: each encoder replica's ranks")
    g.add_argument("--encoder-data-parallel-size", type=int, default=None,
                   help="with --encoder-schedule separate: encoder replicas on ranks of "
                        "their own, each of --encoder-tensor-model-parallel-size ranks "
                        "(default 1 there), the world's first ranks; the LLM's data-"
                        "parallel size is what the rest leave (Megatron-Bridge MIMO's "
                        "per-module data_parallel_size)")
    for slot in SLOTS:  # vision, audio: the chain's order, so the ranks' order
        g.add_argument(f"--{slot}-encoder-data-parallel-size", type=int, default=None,
                       help=f"with --encoder-schedule separate: the {slot} encoder on "
                            "replicas of its own, this many (default 1 once any encoder's "
                            "is given), each of --encoder-tensor-model-parallel-size ranks; "
                            "the encoders' replica sets come first in chain order (vision, "
                            "audio), the LLM after them (Megatron-Bridge MIMO's per-module "
                            "data_parallel_size and rank_offset)")
    g.add_argument("--encoder-virtual-pipeline-model-parallel-size", type=int, default=None,
                   help="with coarse|bubble: interleave the encoder over its pipeline as "
                        "--virtual-pipeline-model-parallel-size interleaves the LLM: its "
                        "layers run this many rounds over the encoder's stages, each rank "
                        "holding one range per round, so the first micro-batch's first "
                        "piece (which the other ranks wait for) and the last one's backward "
                        "are this many times shorter (default 1: not interleaved)")
    g.add_argument("--encoder-pieces", type=int, default=1,
                   help="pieces per encoder stage with coarse|bubble: finer pieces fit "
                        "shorter bubbles")
    g.add_argument("--encoder-placement", choices=["first", "last", "auto"], default="auto",
                   help="which end of the pipeline the encoder's first stage sits at with "
                        "coarse|bubble: first (rank 0) or last (its forwards start on the "
                        "last rank, idle in the LLM's warm-up, and its backwards end on the "
                        "first, idle in the cool-down); auto: the faster of the two in "
                        "simulation for bubble, first for coarse")
    g = p.add_argument_group("activation recomputation")
    g.add_argument("--recompute-granularity", choices=["full", "selective"], default=None,
                   help="full: recompute whole transformer layers (--recompute-method, "
                        "--recompute-num-layers); selective: only core attention")
    g.add_argument("--recompute-method", choices=["uniform", "block"], default=None,
                   help="uniform: layers in groups of --recompute-num-layers; block: the "
                        "first --recompute-num-layers layers of each stack in each chunk")
    g.add_argument("--recompute-num-layers", type=int, default=None)
    g.add_argument("--recompute-memory-budget", type=float, default=None, metavar="GB",
                   help="adaptive recompute (OmniBal): per pipeline stage, recompute the "
                        "fewest leading layers (block method) that keep model state plus "
                        "in-flight activations within this many GB per rank; activation "
                        "bytes from --pipeline-profile when it has them, else the model")
    g = p.add_argument_group("parallelism")
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--overlap-grad-reduce", action="store_true")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="the distributed optimizer's parameter all-gather in the next "
                        "forward, bucket by bucket, as each bucket is first used (needs "
                        "--use-distributed-optimizer and --overlap-grad-reduce)")
    g.add_argument("--ddp-bucket-size", type=int, default=None,
                   help="parameters per DDP bucket (default: Megatron-Core's)")
    g.add_argument("--distributed-backend", choices=["nccl", "gloo"], default=None,
                   help="default: nccl with CUDA, gloo without")
    g.add_argument("--distributed-timeout-minutes", type=int, default=10)
    add_expert_parallel_args(g)

    g = p.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=8)
    g.add_argument("--global-batch-size", type=int, default=None)
    g.add_argument("--train-iters", type=int, default=100)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", default="cosine",
                   choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-warmup-init", type=float, default=0.0)
    g.add_argument("--weight-decay", type=float, default=0.01)
    add_module_lr_args(g)  # --vision-lr, --projector-lr ...
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--bf16", action="store_true")

    g = p.add_argument_group("checkpointing")
    g.add_argument("--save", default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--no-save-optim", action="store_true")
    g.add_argument("--no-save-rng", action="store_true")
    # Megatron-LM's: the distributed optimizer saves dp_reshardable (each rank its own
    # shard, no gather) unless asked for the state resharded across TP/PP/EP too
    g.add_argument("--dist-ckpt-optim-fully-reshardable", action="store_true",
                   help="save the distributed optimizer's state reshardable across TP/PP "
                        "(gathered over the data-parallel ranks at each save); default "
                        "dp_reshardable: it loads at another data-parallel size only")
    g.add_argument("--distrib-optim-fully-reshardable-mem-efficient", action="store_true",
                   help="with --dist-ckpt-optim-fully-reshardable: gather over gloo to the "
                        "first data-parallel rank only (less host and device memory, "
                        "a serial save)")
    g.add_argument("--ckpt-step", type=int, default=None,
                   help="load iteration N of --load instead of the one its "
                        "latest_checkpointed_iteration.txt names (Megatron-LM's; 0: that "
                        "one): the way back from a damaged checkpoint")
    g.add_argument("--finetune", action="store_true",
                   help="load model weights only and start at iteration 0")
    g.add_argument("--exit-on-missing-checkpoint", action="store_true",
                   help="kept for Megatron compatibility: a --load without a checkpoint is "
                        "always an error unless --load equals --save (auto-resume)")

    g = p.add_argument_group("data, logging and evaluation")
    g.add_argument("--data-path", nargs="+", default=None,
                   help="a directory with train.jsonl and valid.jsonl, a train .jsonl (then "
                        "pass --valid-data-path), or a Megatron-Energon dataset; a weighted "
                        "blend as weight-path pairs: 0.7 A 0.3 B. Default: the built-in "
                        "digits data")
    g.add_argument("--valid-data-path", default=None)
    g.add_argument("--data-cache-path", default=None,
                   help="where the built-in dataset is written (default ~/.cache/megatron_mm)")
    g.add_argument("--tokenizer-type", default="MistralV1SentencePiece",
                   choices=["MistralV1SentencePiece", "SentencePiece", "HuggingFaceTokenizer"])
    g.add_argument("--tokenizer-model", default=None,
                   help="a SentencePiece .model, or a directory with tokenizer.json")
    g.add_argument("--image-processor-config", default=None,
                   help="a Hugging Face preprocessor_config.json (CLIP / SigLIP image "
                        "processor); default: bicubic resize to --img-h with CLIP's mean/std")
    g.add_argument("--num-workers", type=int, default=0)
    g.add_argument("--data-balance", choices=["none", "isf", "isf-sorted"], default="none",
                   help="pack training samples into sequences balanced on vision and LLM "
                        "work across data-parallel ranks (OmniBal ISF); isf-sorted also "
                        "gives each step's ranks groups of matched work. --micro-batch-size "
                        "is then the mean samples per packed micro-batch")
    g.add_argument("--data-balance-bounds", default="auto",
                   help="auto (searched for the dataset) or Q_v,Q_t[,Q'_v,Q'_t]: images and "
                        "tokens per packed sequence, and when a group counts as full")
    g.add_argument("--data-balance-iters", type=int, default=10,
                   help="ISF iterations (re-packing rounds)")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--eval-max-new-tokens", type=int, default=8,
                   help="greedy-decoding budget for the answer accuracy (0: no answer "
                        "accuracy, the validation loss only)")
    g.add_argument("--skip-final-eval", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        description="Train a multimodal LLM with Megatron-Core (megatron_mm)",
        allow_abbrev=False)
    _model_args(p)
    add_data_args(p)
    _training_args(p)
    fp8_args(p)
    logging_args(p)
    add_sequence_parallel_args(p)
    add_fusion_args(p)
    add_moe_args(p)
    return p


def parse_args(argv: Optional[Sequence[str]] = None,
               world_size: Optional[int] = None) -> argparse.Namespace:
    """``read_args``, a bad flag reported once per job (one line naming it) and exiting."""
    try:
        return read_args(argv, world_size)
    except ConfigError as e:  # once per job, without argparse's usage
        exit_with_user_error(e, build_parser().prog)


def read_args(argv: Optional[Sequence[str]] = None,
              world_size: Optional[int] = None) -> argparse.Namespace:
    """The flags of ``argv`` with those the checkpoint ``--load`` names fixes, checked
    (a ConfigError names the flag), with Megatron's derived values; the run reads them as
    a ``run_config.RunConfig``."""
    args = build_parser().parse_args(argv)
    given = given_flags(argv)
    apply_checkpoint_args(args, given)
    refuse_moe_flags_given_to_dense(args, given)
    return validate_args(args, world_size)


def validate_args(args: argparse.Namespace,
                  world_size: Optional[int] = None) -> argparse.Namespace:
    """Check the flags together; returns them with Megatron's dependent values derived (a
    copy: ``args`` is not written to)."""
    args = copy.copy(args)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if args.virtual_pipeline_model_parallel_size is not None:
            raise ConfigError("pass --virtual-pipeline-model-parallel-size or "
                              "--num-layers-per-virtual-pipeline-stage, not both")
        per_rank, rem = divmod(args.num_layers // max(pp, 1),
                               args.num_layers_per_virtual_pipeline_stage)
        if rem:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage must divide the "
                              "layers per pipeline rank")
        args.virtual_pipeline_model_parallel_size = per_rank
    vpp = args.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp <= 1:
        args.virtual_pipeline_model_parallel_size = vpp = None
    if vpp is not None and pp < 2:
        raise ConfigError("virtual pipeline stages need --pipeline-model-parallel-size >= 2")
    policy = parse_partition_flag(args.pipeline_partition)  # the flag stays as typed
    if isinstance(policy, list) and len(policy) != pp * (vpp or 1):
        raise ConfigError(
            f"--pipeline-partition lists {len(policy)} stages, but "
            f"--pipeline-model-parallel-size ({pp})"
            + (f" x --virtual-pipeline-model-parallel-size ({vpp})" if vpp else "")
            + f" = {pp * (vpp or 1)}; give one layer count per stage")
    _validate_search_and_recompute(args)
    cp = args.context_parallel_size
    if cp < 1:
        raise ConfigError("--context-parallel-size must be >= 1")
    check_gdn_context_parallel(args)
    if args.overlap_param_gather and not (args.use_distributed_optimizer
                                          and args.overlap_grad_reduce):
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer and "
                          "--overlap-grad-reduce (as in Megatron-LM)")
    if args.context_parallel_block < 1:
        raise ConfigError("--context-parallel-block must be >= 1")
    if args.context_parallel_block_overhead < 0:
        raise ConfigError("--context-parallel-block-overhead must be >= 0")
    if not args.fp8_emulation:  # the emulation's own check names what to change
        validate_transformer_impl(args)
    if args.encoder_schedule == "separate":  # the LLM has the ranks the encoders leave
        world_size = validate_separate_sizes(args, world_size)
    else:
        for flag in ["encoder_data_parallel_size"] + [
                f"{slot}_encoder_data_parallel_size" for slot in SLOTS]:
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --encoder-schedule "
                                  "separate")
    if world_size % (tp * pp * cp):
        raise ConfigError(
            f"world size {world_size} is not divisible by --tensor-model-parallel-size ({tp})"
            f" x --pipeline-model-parallel-size ({pp})"
            f" x --context-parallel-size ({cp})")
    args.world_size = world_size
    args.data_parallel_size = world_size // (tp * pp * cp)
    dp, mbs = args.data_parallel_size, args.micro_batch_size
    if args.global_batch_size is None:
        args.global_batch_size = mbs * dp
    if args.global_batch_size % (mbs * dp):
        raise ConfigError(
            f"--global-batch-size ({args.global_batch_size}) must be a multiple of "
            f"--micro-batch-size ({mbs}) x data-parallel size ({dp})")
    args.num_microbatches = args.global_batch_size // (mbs * dp)
    if vpp is not None and args.num_microbatches % pp:
        raise ConfigError(
            f"interleaved 1F1B needs the micro-batches per step ({args.num_microbatches} = "
            f"--global-batch-size / (--micro-batch-size x data-parallel size)) to be a "
            f"multiple of --pipeline-model-parallel-size ({pp})")
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.lr_decay_iters is None:
        args.lr_decay_iters = max(args.train_iters, 1)
    if args.lr_warmup_iters > args.lr_decay_iters:
        raise ConfigError(f"--lr-warmup-iters ({args.lr_warmup_iters}) exceeds "
                          f"--lr-decay-iters ({args.lr_decay_iters})")
    if args.min_lr > args.lr:
        raise ConfigError(f"--min-lr ({args.min_lr}) exceeds --lr ({args.lr})")
    if args.save_interval is not None and args.save is None:
        raise ConfigError("--save-interval needs --save DIR")
    if args.ckpt_step is not None and args.ckpt_step < 0:
        raise ConfigError("--ckpt-step must not be negative")
    if args.ckpt_step and args.load is None:
        raise ConfigError("--ckpt-step needs --load DIR")
    if args.eval_interval is None:
        args.eval_interval = max(args.train_iters, 1)
    if args.train_iters < 0:  # 0 with --save writes the initial checkpoint
        raise ConfigError("--train-iters must not be negative")
    for flag in ("log_interval", "eval_interval"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive")
    if args.eval_iters < 0:  # 0: no validation, as in Megatron-LM
        raise ConfigError("--eval-iters must not be negative (0 disables validation)")
    if args.eval_max_new_tokens < 0:  # 0: no answer accuracy
        raise ConfigError("--eval-max-new-tokens must not be negative (0: no answer accuracy)")
    validate_logging_args(args)
    _validate_data_balance(args)
    validate_data_args(args)
    from .run_config import group_of_flags  # its groups are made from this parser

    args.model_config = build_model_config(group_of_flags("model", args),
                                           group_of_flags("moe", args))
    _validate_encoder_schedule(args)
    validate_sequence_parallel(args)
    validate_moe_args(args)
    args.model_config.lora = lora_config(args)
    validate_module_lr_args(args, [m for m, _ in args.model_config.lora.targets]
                            if args.model_config.lora else ())
    args.model_config.validate_parallel(tp, args.encoder_tensor_model_parallel_size)
    validate_fp8_args(args)
    # The pipeline plan needs the vocabulary: the Trainer plans once the tokenizer loads.
    return args


def _validate_encoder_schedule(args: argparse.Namespace) -> None:
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.vision_dp_when_cp and args.encoder_schedule != "megatron":
        raise ConfigError(f"--vision-dp-when-cp needs --encoder-schedule megatron (the "
                          f"schedule executor of --encoder-schedule {args.encoder_schedule} "
                          "runs each micro-batch's items whole on every CP rank)")
    if args.encoder_schedule == "auto":  # the plan picks, among the options these allow
        _validate_auto(args)
        _validate_encoder_interleaving(args)
        return
    if args.encoder_schedule == "separate":
        validate_separate(args)
        return
    if args.encoder_schedule == "megatron":
        for flag in ("encoder_pipeline_model_parallel_size",
                     "encoder_tensor_model_parallel_size",
                     "encoder_virtual_pipeline_model_parallel_size"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --encoder-schedule "
                                  "coarse or bubble")
        return
    if args.encoder_pipeline_model_parallel_size is None:
        args.encoder_pipeline_model_parallel_size = pp
    _validate_encoder_interleaving(args)
    etp = args.encoder_tensor_model_parallel_size
    if etp is not None and (etp < 1 or tp % etp):
        raise ConfigError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                          f"--tensor-model-parallel-size ({tp})")
    if etp is None:
        args.encoder_tensor_model_parallel_size = tp
    blockers = [(args.pipeline_partition == "search", "--pipeline-partition search"),
                (args.recompute_memory_budget is not None, "--recompute-memory-budget"),
                # encoder replicas' groups assume one CP rank (their TP x CP group)
                (args.encoder_tensor_model_parallel_size < tp
                 and args.context_parallel_size > 1,
                 "--encoder-tensor-model-parallel-size below --tensor-model-parallel-size "
                 "and --context-parallel-size > 1 together")]
    for blocked, flag in blockers:
        if blocked:
            raise ConfigError(f"--encoder-schedule {args.encoder_schedule} does not combine "
                              f"with {flag} yet: drop one of them")


def _validate_encoder_interleaving(args: argparse.Namespace) -> None:
    """``--encoder-virtual-pipeline-model-parallel-size``: at least 1; above 1 over an
    encoder pipeline of at least 2 stages (one stage has nothing to interleave with)."""
    v = args.encoder_virtual_pipeline_model_parallel_size
    if v is None:
        return
    if v < 1:
        raise ConfigError(f"--encoder-virtual-pipeline-model-parallel-size must be at least "
                          f"1 (got {v})")
    stages = args.encoder_pipeline_model_parallel_size or args.pipeline_model_parallel_size
    if v > 1 and stages < 2:
        raise ConfigError(f"--encoder-virtual-pipeline-model-parallel-size {v} interleaves "
                          "the encoder over its pipeline stages: it needs "
                          "--encoder-pipeline-model-parallel-size of at least 2 (it is "
                          f"{stages})")


def _validate_auto(args: argparse.Namespace) -> None:
    """``--encoder-schedule auto``: what it can choose from (the choice itself is made with
    the training plan, on the real vocabulary: ``planning/encoder_schedule_auto.py``)."""
    tp, etp = args.tensor_model_parallel_size, args.encoder_tensor_model_parallel_size
    if etp is not None and (etp < 1 or tp % etp):
        raise ConfigError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                          f"--tensor-model-parallel-size ({tp})")
    if etp is not None and etp < tp and (args.pipeline_partition == "search"
                                         or args.recompute_memory_budget is not None
                                         or args.context_parallel_size > 1):
        raise ConfigError("--encoder-schedule auto has nothing to choose from: "
                          "--encoder-tensor-model-parallel-size below --tensor-model-parallel-"
                          "size needs the encoder as its own pipeline, which "
                          "--pipeline-partition search / --recompute-memory-budget / "
                          "--context-parallel-size > 1 exclude")


def _validate_search_and_recompute(args: argparse.Namespace) -> None:
    for flag in ("pipeline_search_candidates", "pipeline_search_iters"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.pipeline_search_radius < 0:
        raise ConfigError("--pipeline-search-radius must be >= 0")
    gran, method, n = (args.recompute_granularity, args.recompute_method,
                       args.recompute_num_layers)
    if args.recompute_memory_budget is not None:
        if args.recompute_memory_budget <= 0:
            raise ConfigError("--recompute-memory-budget must be positive (GB per rank)")
        if gran not in (None, "full") or method not in (None, "block") or n is not None:
            raise ConfigError("--recompute-memory-budget chooses --recompute-num-layers per "
                              "stage for --recompute-granularity full --recompute-method "
                              "block: drop the other --recompute-* flags")
        args.recompute_granularity, args.recompute_method = "full", "block"
        return
    if gran == "selective" and (method is not None or n is not None):
        raise ConfigError("--recompute-granularity selective takes no --recompute-method "
                          "or --recompute-num-layers")
    if gran == "full" and (method is None or n is None):
        raise ConfigError("--recompute-granularity full needs --recompute-method "
                          "(uniform or block) and --recompute-num-layers")
    if gran is None and (method is not None or n is not None):
        raise ConfigError("--recompute-method and --recompute-num-layers need "
                          "--recompute-granularity full")
    if n is not None and n < 1:
        raise ConfigError("--recompute-num-layers must be >= 1")


# What a checkpoint's saved flags decide when --load names it (Megatron-LM's
# --use-checkpoint-args, always on): the architecture, its tokenizer and image processor.
CHECKPOINT_FLAGS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "group_query_attention", "num_query_groups", "kv_channels", "max_position_embeddings",
    "rotary_base", "position_embedding_type", "mrope_section", "mrope_interleaved",
    "use_rope_scaling",
    "rope_scaling_factor", "rotary_scaling_factor", "yarn_original_max_position_embeddings",
    "yarn_beta_fast", "yarn_beta_slow", "mscale", "mscale_all_dim",
    "yarn_correction_range_round_to_int", "add_qkv_bias", "qk_layernorm",
    "untie_embeddings_and_output_weights", "norm_epsilon", "make_vocab_size_divisible_by",
    "vision_model_type", "vision_hidden_size",
    "vision_num_layers", "vision_num_attention_heads", "vision_ffn_hidden_size",
    "vision_feature_layer", "vision_norm_epsilon", "img_h", "img_w", "patch_dim",
    "disable_vision_class_token", "projector_type", "projector_ffn_hidden_size",
    "audio_model_type", "audio_hidden_size", "audio_num_layers", "audio_num_attention_heads",
    "audio_ffn_hidden_size", "audio_num_mel_bins", "audio_max_source_positions",
    "audio_pool_stride", "audio_norm_epsilon", "audio_projector_type", "audio_token_id",
    "image_token_id", "tokenizer_type", "tokenizer_model", "image_processor_config",
    "num_experts", "moe_ffn_hidden_size", "moe_layer_freq", "moe_router_topk",
    "moe_router_pre_softmax", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
    *LINEAR_ATTENTION_FLAGS,
) + tuple(dest for f in FAMILIES.values() for dest in f.checkpoint_flags)
# Saved relative to the checkpoint directory (files the converter put there).
CHECKPOINT_PATH_FLAGS = ("tokenizer_model", "image_processor_config")


def given_flags(argv: Optional[Sequence[str]]) -> set:
    """The dests of the flags written on the command line (not left at their default)."""
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_args(argv)))


def apply_checkpoint_args(args: argparse.Namespace, given: set) -> None:
    """Take the architecture from the checkpoint ``--load`` names: flags left out come
    from it, flags given must agree with it."""
    if not args.load:
        return
    from ..checkpoint.checkpointing import CheckpointError, saved_args  # torch: only with --load
    from .run_config import group_of_flags  # its groups are made from this parser

    try:
        saved = saved_args(group_of_flags("checkpoint", args))
    except CheckpointError:
        return  # reported with the other --load problems when loading
    for dest in CHECKPOINT_FLAGS:
        if dest not in saved:
            continue
        value = saved[dest]
        if dest in CHECKPOINT_PATH_FLAGS and value and not os.path.isabs(value):
            value = os.path.join(args.load, value)
        if isinstance(value, list):
            value = tuple(value)
        given_value = getattr(args, dest)
        if isinstance(given_value, list):  # nargs flags: compare as the saved tuple
            given_value = tuple(given_value)
        if dest in given and given_value != value:
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(args, dest)} disagrees with the checkpoint in "
                              f"--load {args.load} ({value}); drop the flag to use the "
                              f"checkpoint's value")
        setattr(args, dest, value)
    lora_flags_from_checkpoint(args, saved, given)  # its adapters, as it was saved


def _validate_data_balance(args: argparse.Namespace) -> None:
    from ...plan.balance import parse_bounds  # pure Python

    if args.data_balance == "none":
        return
    parse_bounds(args.data_balance_bounds)  # a PlanError (ConfigError) names the flag
    if args.data_balance_iters < 1:
        raise ConfigError("--data-balance-iters must be >= 1")


def slot_choices(slot: str) -> list:
    """``--{slot}-model-type`` values: the registered families of the slot, and none."""
    return sorted(f.model_type for f in slot_families(slot)) + ["none"]

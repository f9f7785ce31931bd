"""Megatron-LM's mixture-of-experts flags (``--num-experts``, ``--moe-*``) and expert
parallelism (``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``), with
Megatron-LM's dests, defaults and meanings, and the checks that make a bad combination
fail up front. No torch import.

The LLM's layers are Megatron-Core's: ``MoELayer`` (``TopKRouter``, the token dispatcher
named here, ``SequentialMLP`` experts with ``--transformer-impl local``, TE's grouped GEMM
with ``--moe-grouped-gemm``), dropless (no capacity factor).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from typing import Optional, Union

from ...config import ConfigError, MoEConfig

DISPATCHERS = ("allgather", "alltoall")  # Megatron's "flex" needs DeepEP / HybridEP (GPU)
LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


def moe_freq_type(text: str) -> Union[int, list]:
    """Megatron-LM's ``--moe-layer-freq``: an int N (one MoE layer every N layers: layer i
    when i % N == 0) or a list expression of 0/1 per layer, e.g. ``([0]+[1]*3)*2`` (1: MoE,
    0: dense). Lists, ints, ``+`` and ``*`` only (Megatron-LM evaluates the string). A
    value already typed (an int, a list: the converter's flags) is taken as it is."""
    if isinstance(text, int) or isinstance(text, list):
        return text
    if "[" not in text:
        return int(text)

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(text)

    try:
        out = value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: an int or a list of 0/1 such as ([0]+[1]*3)*2") from None
    if not isinstance(out, list):
        raise argparse.ArgumentTypeError(f"{text!r}: an int or a list of 0/1")
    return out


def moe_config(moe, model) -> Optional[MoEConfig]:
    """The LLM's ``MoEConfig`` from the RunConfig's moe group (``model``: its model group
    for the default expert size); None: a dense LLM."""
    if moe is None or moe.num_experts is None:
        return None
    freq = moe.moe_layer_freq
    return MoEConfig(
        num_experts=moe.num_experts,
        ffn_hidden_size=moe.moe_ffn_hidden_size or model.ffn_hidden_size
        or 4 * model.hidden_size,
        router_topk=moe.moe_router_topk,
        router_pre_softmax=moe.moe_router_pre_softmax,
        router_load_balancing_type=moe.moe_router_load_balancing_type,
        aux_loss_coeff=moe.moe_aux_loss_coeff,
        layer_freq=freq if isinstance(freq, int) else tuple(freq),
        token_dispatcher_type=moe.moe_token_dispatcher_type,
        grouped_gemm=moe.moe_grouped_gemm,
        shared_expert_intermediate_size=moe.moe_shared_expert_intermediate_size,
        shared_expert_gate=moe.moe_shared_expert_gate)


# Flags that only mean something with --num-experts: their parser defaults.
def moe_only() -> dict:
    """The flags only an MoE model reads (every MoE flag but --num-experts, and the expert
    parallel sizes) -> their defaults, from the groups (which import this module)."""
    from .groups import MoeArgs, ParallelArgs

    moe, parallel = MoeArgs(), ParallelArgs()
    out = {f.name: getattr(moe, f.name) for f in dataclasses.fields(MoeArgs)
           if f.name != "num_experts"}
    for name in ("expert_model_parallel_size", "expert_tensor_parallel_size"):
        out[name] = getattr(parallel, name)
    return out



def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _refuse_on_dense(dest: str) -> None:
    raise ConfigError(f"{_flag(dest)} needs an MoE LLM (--num-experts); this LLM is dense")


def refuse_moe_flags_given_to_dense(args: argparse.Namespace, given: set) -> None:
    """An MoE flag written on a dense LLM's command line, even at its default value
    (``--moe-router-topk 2``), which ``validate_moe_args`` cannot tell from its absence."""
    if args.num_experts is None:
        for dest in moe_only():
            if dest in given:
                _refuse_on_dense(dest)


def refuse_uneven_expert_gathers(moe, parallel, backend: str) -> None:
    """Megatron-Core's all-to-all dispatcher at ETP > 1 and EP > 1 all-gathers the expert-TP
    ranks' tokens routed to their experts, pieces of uneven sizes: NCCL's all-gather takes
    them, gloo's stops mid-run (``moe``, ``parallel``: the RunConfig's groups)."""
    if moe is None or moe.num_experts is None or moe.moe_token_dispatcher_type != "alltoall":
        return
    etp, ep = parallel.expert_tensor_parallel_size, parallel.expert_model_parallel_size
    if backend == "gloo" and etp > 1 and ep > 1:
        raise ConfigError(
            f"--expert-tensor-parallel-size {etp} with --expert-model-parallel-size {ep} "
            "(--moe-token-dispatcher-type alltoall) needs NCCL: gloo's all-gather does not "
            "take the experts' uneven token counts; pass --expert-tensor-parallel-size 1")


def validate_moe_args(config):
    """After the world's sizes are known: ``config`` (the RunConfig) with Megatron-LM's
    default ``--expert-tensor-parallel-size`` (the TP size) for an MoE LLM."""
    if config.moe.num_experts is None:
        for dest, default in moe_only().items():
            group = config.parallel if dest.startswith("expert_") else config.moe
            if getattr(group, dest) != default:
                _refuse_on_dense(dest)
        return config
    par = config.parallel
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    ep = config.parallel.expert_model_parallel_size
    if config.parallel.expert_tensor_parallel_size is None:
        config = dataclasses.replace(config, parallel=dataclasses.replace(
            config.parallel, expert_tensor_parallel_size=tp))
    etp = config.parallel.expert_tensor_parallel_size
    if ep < 1 or etp < 1:
        raise ConfigError("--expert-model-parallel-size and --expert-tensor-parallel-size "
                          "must be >= 1")
    if config.moe.num_experts % ep:
        raise ConfigError(f"--num-experts ({config.moe.num_experts}) is not divisible by "
                          f"--expert-model-parallel-size ({ep}): each rank holds the same "
                          "number of experts")
    if config.parallel.world_size % (etp * ep * pp):
        raise ConfigError(
            f"world size {config.parallel.world_size} is not divisible by "
            f"--expert-tensor-parallel-size"
            f" ({etp}) x --expert-model-parallel-size ({ep}) x "
            f"--pipeline-model-parallel-size ({pp})")
    expert_ffn = (config.moe.moe_ffn_hidden_size or config.model.ffn_hidden_size
                  or 4 * config.model.hidden_size)
    if expert_ffn % etp:
        raise ConfigError(f"--moe-ffn-hidden-size ({expert_ffn}) is not divisible by "
                          f"--expert-tensor-parallel-size ({etp})")
    if tp > 1 and not config.parallel.sequence_parallel:  # Megatron-Core's MoELayer refuses it
        raise ConfigError(f"--num-experts with --tensor-model-parallel-size {tp} needs "
                          "--sequence-parallel (Megatron-Core's MoE layers)")
    if pp > 1 and config.moe.moe_token_dispatcher_type == "allgather":
        raise ConfigError("--moe-token-dispatcher-type allgather does not take micro-batches "
                          "of varying length, which pipeline parallelism sends: pass "
                          "--moe-token-dispatcher-type alltoall")
    if config.moe.moe_grouped_gemm and config.model.transformer_impl != "transformer_engine":
        raise ConfigError("--moe-grouped-gemm is Transformer Engine's grouped GEMM: it needs "
                          "--transformer-impl transformer_engine (CUDA and TE); drop it for "
                          "one local MLP per expert")
    if config.fp8.fp8 is not None or config.fp8.fp8_emulation:
        raise ConfigError("--num-experts does not combine with FP8 yet: drop one of them")
    return config

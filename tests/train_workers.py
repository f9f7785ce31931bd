"""Workers that run the real training script in spawned ranks and report losses,
gradients and parameters gathered to their full (TP=1) shapes."""

from __future__ import annotations

import os

import torch


# A model small enough for 2 CPU cores, with every architectural feature switched on.
TINY_MODEL = [
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--add-qkv-bias", "--untie-embeddings-and-output-weights", "--seq-length", "64",
    "--vision-hidden-size", "32", "--vision-num-layers", "2",
    "--vision-num-attention-heads", "2", "--img-h", "16", "--img-w", "16", "--patch-dim", "4",
    "--disable-vision-class-token", "--projector-ffn-hidden-size", "64",
    "--lr", "1e-3", "--lr-decay-style", "constant", "--weight-decay", "0.0",
    "--log-interval", "1", "--eval-iters", "1", "--skip-final-eval",
]


def full_tensor(param: torch.nn.Parameter, tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Gather a tensor-parallel shard to the TP=1 layout (Megatron's partition_dim/stride)
    over ``group``, the TP group of the module holding it (default: the LLM's)."""
    from megatron.core import parallel_state

    if group is None:
        group = parallel_state.get_tensor_model_parallel_group()
    if not getattr(param, "tensor_model_parallel", False) or group.size() == 1:
        return tensor.detach().float().clone()
    shards = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(shards, tensor.contiguous(), group=group)
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    # A stride-2 weight ([gate; up] per rank) interleaves its pieces across ranks.
    pieces = [s.chunk(stride, dim) for s in shards]
    return torch.cat([p[k] for k in range(stride) for p in pieces], dim).float()


def global_names(model) -> dict:
    """Parameter name -> its name in the whole (PP=1) model: a pipeline stage numbers its
    transformer layers from 0, Megatron's ``layer_number`` is global (1-based)."""
    renamed = {}
    for prefix, module in model.named_modules():
        head, _, index = prefix.rpartition(".layers.")
        if index.isdigit() and hasattr(module, "layer_number"):
            renamed[prefix] = f"{head}.layers.{module.layer_number - 1}"
    out = {}
    for name, _ in model.named_parameters():
        prefix = max((p for p in renamed if name.startswith(p + ".")), key=len, default=None)
        out[name] = renamed[prefix] + name[len(prefix):] if prefix else name
    return out


def full_state(chunks, grads: bool) -> dict:
    """Every parameter (or gradient) of this rank's model chunks, by global name."""
    out = {}
    named = [(global_names(chunk)[local], param) for chunk in chunks
             for local, param in chunk.named_parameters()]
    groups = tp_groups(chunks)
    for name, param in named:
        group = groups.get(id(param))
        if grads:
            grad = getattr(param, "main_grad", None)
            out[name] = None if grad is None else full_tensor(param, grad, group)
        else:
            out[name] = full_tensor(param, param.data, group)
    return with_all_experts(out)


def with_all_experts(state: dict) -> dict:
    """``state`` with every expert of the MoE layers under its global number (expert
    parallelism: each rank holds ``local_experts.0 ..`` of its own share), gathered over the
    expert-model-parallel group."""
    import re

    from megatron.core import parallel_state

    ep = parallel_state.get_expert_model_parallel_world_size()
    if ep == 1:
        return state
    pattern = re.compile(r"(.*\.local_experts\.)(\d+)(\..*)")
    local = {n: pattern.fullmatch(n) for n in state}
    per_rank = 1 + max((int(m.group(2)) for m in local.values() if m), default=-1)
    rank = parallel_state.get_expert_model_parallel_rank()
    mine = {f"{m.group(1)}{rank * per_rank + int(m.group(2))}{m.group(3)}": state[n]
            for n, m in local.items() if m}
    gathered = [None] * ep
    torch.distributed.all_gather_object(
        gathered, mine, group=parallel_state.get_expert_model_parallel_group())
    out = {n: v for n, v in state.items() if not local[n]}
    for part in gathered:
        out.update(part)
    return out


def tp_groups(chunks) -> dict:
    """id(parameter) -> the TP group of the module holding it, where that module has one
    (Megatron-Core's parallel layers; an encoder's layers may have a TP of their own)."""
    groups = {}
    for chunk in chunks:
        for module in chunk.modules():
            group = getattr(module, "tp_group", None)
            if group is not None:
                for param in module.parameters(recurse=False):
                    groups[id(param)] = group
    return groups


def norm_squares(chunks) -> dict:
    """Per top-level module (``vision_model``, ``language_model``, ...): the sum of squared
    gradients this rank adds to Megatron-Core's gradient norm (params neither ``shared`` nor
    a TP duplicate, Megatron's own tests). Summed over a run's ranks it equals one
    process's when each parameter is counted exactly once; like Megatron's norm (over the
    model-parallel group), only data-parallel rank 0 counts: its replicas hold the same
    reduced gradients (an MoE LLM's experts, not all-reduced over data-parallel ranks:
    expert-data-parallel rank 0, its EP ranks holding different experts)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    tp_group = parallel_state.get_tensor_model_parallel_group()
    out = {}
    counts = {True: parallel_state.get_data_parallel_rank() == 0,  # by param.allreduce
              False: parallel_state.get_expert_data_parallel_rank() == 0}
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            grad = getattr(param, "main_grad", None)
            if (grad is not None and counts[getattr(param, "allreduce", True)]
                    and param_is_not_shared(param)
                    and param_is_not_tensor_parallel_duplicate(param, tp_group=tp_group)):
                top = name.split(".")[0]
                out[top] = out.get(top, 0.0) + float(grad.double().pow(2).sum())
    return out


def train(rank: int, argv: list, grad_steps=(), hooks=None) -> dict:
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import TrainingCallbacks

    args = parse_args(argv, world_size=int(os.environ["WORLD_SIZE"]))
    grads, squares, holder = {}, {}, {}

    def on_model_built(model, chunks, optimizer):
        holder["model"] = model
        if hooks is not None:
            hooks(model, optimizer, holder)

    def on_step(iteration, model, loss):
        if iteration in grad_steps:
            grads[iteration] = full_state(model, grads=True)
            squares[iteration] = norm_squares(model)

    summary = pretrain(RunConfig.from_flags(args), TrainingCallbacks(on_model_built, on_step))
    summary["grads"] = grads
    summary["norm_squares"] = squares
    summary["params"] = full_state(holder["model"], grads=False)
    summary["observed"] = {k: v for k, v in holder.items() if k != "model"}
    return summary


def train_logging_collectives(rank: int, argv: list, grad_steps=(), hooks=None,
                              watchdog_s: float = 180.0) -> dict:
    """``train``, with the collectives this rank issues (``dist_harness.log_collectives``)
    under ``"collectives"``. Collectives that do not pair up across ranks may hang: past
    ``watchdog_s`` the rank exits with an error instead."""
    import sys
    import threading

    from dist_harness import log_collectives

    def stuck():
        print(f"rank {rank} stuck after {watchdog_s} s; its collectives per group: {log}",
              file=sys.stderr, flush=True)
        os._exit(3)

    watchdog = threading.Timer(watchdog_s, stuck)
    watchdog.daemon = True
    log = log_collectives()
    watchdog.start()
    try:
        out = train(rank, argv, grad_steps, hooks)
    finally:
        watchdog.cancel()
    out["collectives"] = log
    return out


def count_vit_layer_calls(chunks, optimizer, holder):
    """A ``train`` hook: count forward and backward calls of the ViT layers this rank holds."""
    counts = holder["vit_calls"] = {"fwd": 0, "bwd": 0, "layers": 0}

    def bump(key):
        def hook(*_):
            counts[key] += 1
        return hook

    for chunk in chunks:
        vit = getattr(chunk, "vision_model", None)
        for layer in (vit.decoder.layers if vit is not None and vit.decoder else ()):
            counts["layers"] += 1
            layer.register_forward_hook(bump("fwd"))
            layer.register_full_backward_hook(bump("bwd"))


def count_vit_calls_and_host_syncs(chunks, optimizer, holder):
    """Both ``count_vit_layer_calls`` and ``host_syncs.count_model_host_syncs``: one run
    checks its ViT calls and that the model reads no device value."""
    from host_syncs import count_model_host_syncs

    count_vit_layer_calls(chunks, optimizer, holder)
    count_model_host_syncs(chunks, optimizer, holder)


def count_encoded_rows(chunks, optimizer, holder):
    """A ``train`` hook: per training micro-batch on this rank, [rows the vision encoder
    embeds (images, or Qwen2.5-VL's patches), placeholder tokens of the micro-batch]
    (``--vision-dp-when-cp``: the CP ranks' rows add up to the micro-batch's)."""
    seen = holder["encoded"] = []

    def layout_hook(module, args, kwargs):
        if module.training:
            seen.append([0, len(kwargs["layout"].slots["vision"])])

    def counted(vit):
        embed = vit.embed

        def run(x):
            if vit.training:
                seen[-1][0] += x.shape[0]
            return embed(x)
        return run

    for chunk in chunks:
        chunk.register_forward_pre_hook(layout_hook, with_kwargs=True)
        vit = getattr(chunk, "vision_model", None)
        if vit is not None and getattr(vit, "has_embed", False):
            vit.embed = counted(vit)


def record_answers(chunks, optimizer, holder):
    """A ``train`` hook: per evaluation's ``val answer accuracy`` the greedy answers (new
    token ids per prompt, in decoding order) and, per row of every decoding forward, the
    logits of its last real token (padding left out), one list each per evaluation."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from megatron_mm.training.loop import evaluation, trainer

    answers, rows = holder["answers"], holder["answer_logits"] = [], []
    accuracy, generate, step = (trainer.answer_accuracy, evaluation.greedy_generate,
                                evaluation.greedy_step)
    decoding, position = [], [-1]

    def each_evaluation(*args, **kwargs):
        answers.append([])
        rows.append([])
        return accuracy(*args, **kwargs)

    def each_batch(*args, **kwargs):
        decoding.append(True)
        try:
            out = generate(*args, **kwargs)
        finally:
            decoding.pop()
        answers[-1] += out
        return out

    def each_step(vocab_size, attention=None, last=-1):
        position[0] = last
        return step(vocab_size, attention, last)

    def record(module, inputs, output):
        if decoding:  # the whole vocabulary (each TP rank holds a shard of it)
            last = gather_from_tensor_model_parallel_region(output[:, position[0]].detach())
            rows[-1] += list(last.float().clone())  # argmax masks it in place

    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):  # its last chunk's
        chunks[-1].register_forward_hook(record)
    trainer.answer_accuracy, evaluation.greedy_generate = each_evaluation, each_batch
    evaluation.greedy_step = each_step

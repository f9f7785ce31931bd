"""LoRA adapters on Megatron-Core's parallel linears, split the way Hugging Face PEFT
names its targets.

A base linear keeps its weights, frozen, and its checkpoint keys; its adapter sits beside
it in the parent module (``linear_qkv_lora`` next to ``linear_qkv``) and adds
``alpha / rank * B(A(dropout(x)))`` to the base's output through a forward hook. The
fused linears get one (A, B) pair per Hugging Face projection, so an adapter exports to a
PEFT adapter as it is: ``linear_qkv`` -> q_proj, k_proj, v_proj (their outputs interleaved
per key/value group, as Megatron-Core lays out the fused output), ``linear_fc1`` of a
gated MLP -> gate_proj, up_proj (``[gate; up]``), ``linear_fc1`` otherwise -> up_proj,
``linear_proj`` -> o_proj, ``linear_fc2`` -> down_proj.

Tensor parallelism (the layout Megatron-Bridge's ParallelLinearAdapter chooses, with the
small rank-sized side replicated instead of split):

- column-parallel base (output split over TP): A [r, in] replicated, B [out/TP, r] split
  on its rows like the base. ``x A^T`` is complete on every rank; its gradient, partial
  per rank (each holds some output rows), is all-reduced (``copy_to_tensor_model_parallel
  _region``). Under sequence parallelism the base gathers the sequence itself; the adapter
  applies A to its own sequence shard and gathers the rank-sized result instead, and A's
  gradient (partial over the sequence) is summed over TP by ``finalize_model_grads``
  (``param.sequence_parallel``).
- row-parallel base (input split over TP): A [r, in/TP] split on its columns like the
  base, its partial products all-reduced (reduce-scattered over the sequence under SP);
  B [out, r] replicated (summed over TP under SP, as above).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from megatron.core.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region, get_cuda_rng_tracker,
    reduce_from_tensor_model_parallel_region, reduce_scatter_to_sequence_parallel_region)
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from ..config import ConfigError, LoraConfig

# Megatron-Core's linear -> the Hugging Face projections its output is made of
PARTS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
         "linear_fc2": ("down_proj",)}
SUFFIX = "_lora"  # the adapter of ``linear_qkv`` is its parent's ``linear_qkv_lora``


def collective_device(group, device: torch.device) -> torch.device:
    """Where a collective over ``group`` takes its tensors: NCCL refuses host tensors (the
    current CUDA device), other backends take ``device``'s."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def parts_of(name: str, parent) -> Tuple[str, ...]:
    """The projections of the linear ``name`` in ``parent`` (an attention or an MLP)."""
    if name == "linear_fc1":
        gated = getattr(parent.config, "gated_linear_unit", False)
        return ("gate_proj", "up_proj") if gated else ("up_proj",)
    return PARTS.get(name, ())


class LoraPair(torch.nn.Module):
    """One projection's A [r, in] and B [out, r] (this rank's shards), PEFT's names.
    ``fresh``: loading a checkpoint without adapters (the base model's) keeps them."""

    def __init__(self, a_shape, b_shape, dtype):
        super().__init__()
        self.lora_A = torch.nn.Parameter(torch.empty(*a_shape, dtype=dtype))
        self.lora_B = torch.nn.Parameter(torch.zeros(*b_shape, dtype=dtype))
        self.fresh = False

    def forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(A, B), read through the module's call: the forward pre-hooks registered on it
        run first. Megatron-Core's DDP waits there for the all-gather of their bucket
        under ``--overlap-param-gather`` (and dispatches the next bucket's); reading the
        attributes directly would use this rank's stale copy of other ranks' shards."""
        return self.lora_A, self.lora_B

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.fresh and not any(k.startswith(prefix) for k in state_dict):
            self.fresh = False  # saved from now on
            return
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class LoraAdapter(torch.nn.Module):
    """The adapter of one base linear: a ``LoraPair`` per projection, their outputs laid
    out as the base's (``sizes``: each projection's output rows on this rank;
    ``groups``: a fused QKV's key/value groups on this rank, else None)."""

    def __init__(self, base: torch.nn.Module, parts: Tuple[str, ...], sizes: List[int],
                 groups: Optional[int], settings: LoraConfig, trained: Tuple[str, ...]):
        super().__init__()
        # a fused linear adapted on some of its projections (q_proj, v_proj): the others'
        # pairs stay zero (B starts zero) and frozen, so the output layout stays whole
        self.trained = trained
        self.column = isinstance(base, ColumnParallelLinear)
        self.tp_group = base.tp_group
        self.tp_size = self.tp_group.size() if self.tp_group is not None else 1
        self.sequence_parallel = bool(base.sequence_parallel) and self.tp_size > 1
        self.parts, self.sizes, self.groups = parts, sizes, groups
        self.scaling, self.rank = settings.scaling, settings.rank
        self.dropout = torch.nn.Dropout(settings.dropout) if settings.dropout else None
        weight = base.weight
        in_local = weight.shape[1]
        full_in = in_local if self.column else in_local * self.tp_size
        for part, rows in zip(parts, sizes):
            a_shape = (settings.rank, full_in if self.column else in_local)
            b_shape = (rows, settings.rank)
            pair = LoraPair(a_shape, b_shape, weight.dtype)
            self._init_a(pair.lora_A, full_in, weight.device)
            for param, split in ((pair.lora_A, not self.column), (pair.lora_B, self.column)):
                if split and self.tp_size > 1:  # sharded like the base
                    set_tensor_model_parallel_attributes(param, True, 1 if param is
                                                         pair.lora_A else 0, 1)
                elif self.sequence_parallel:  # partial over the sequence: summed over TP
                    param.sequence_parallel = True
            pair.requires_grad_(part in trained)
            setattr(self, part, pair)
        # Column-parallel without SP: the input is replicated over TP, so ``x A^T`` needs no
        # collective, but three gradients are partial per rank (each holds some output
        # rows): the base's input gradient, the adapter's, and A's. One all-reduce sums
        # them all (``_SumGradsOverTP`` on the base's input and on A, the base's own
        # input-gradient all-reduce turned off) instead of the base's plus the adapter's.
        self.shared_input = self.column and self.tp_size > 1 and not self.sequence_parallel
        self._stash = None  # (A, [(A, B)]) from the base's pre-hook for its forward hook
        if self.shared_input:
            base.allreduce_dgrad, base.disable_grad_reduce = False, True
            base.register_forward_pre_hook(self._share_input, with_kwargs=True)
        base.register_forward_hook(self._add)

    def _init_a(self, a: torch.nn.Parameter, full_in: int, device) -> None:
        """PEFT's init (kaiming-uniform A, zero B), drawn whole and equal on every TP rank
        (broadcast from the first), then this rank's columns where A is split."""
        full = torch.empty(self.rank, full_in, dtype=torch.float32, device=device)
        torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5))
        if self.tp_size > 1:
            src = torch.distributed.get_global_rank(self.tp_group, 0)
            # on the device the group's backend takes (NCCL: CUDA tensors only; the
            # parameters are on the host under --use-cpu-initialization)
            sent = full.to(collective_device(self.tp_group, full.device))
            torch.distributed.broadcast(sent, src=src, group=self.tp_group)
            full = sent.to(full.device)
            if not self.column:
                rank = self.tp_group.rank()
                full = full.chunk(self.tp_size, dim=1)[rank]
        with torch.no_grad():
            a.copy_(full)

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout is None or not self.training:
            return x
        if self.column and not self.sequence_parallel:  # the same x on every TP rank
            return self.dropout(x)
        with get_cuda_rng_tracker().fork():  # this rank's shard of x
            return self.dropout(x)

    def _weights(self):
        weights = [getattr(self, p)() for p in self.parts]  # each pair's (A, B), its hooks run
        return torch.cat([a for a, _ in weights], dim=0), weights  # one GEMM for all of A

    def _share_input(self, module, args, kwargs):
        """The base's pre-hook (``shared_input``): its input and A through one TP sum of
        their gradients, kept for the adapter's forward (the base's forward hook)."""
        key = "input_" if "input_" in kwargs else None
        x = kwargs[key] if key else args[0]
        a, weights = self._weights()
        x, a = _SumGradsOverTP.apply(x, a, self.tp_group)
        self._stash = (a, weights)
        if key:
            return args, {**kwargs, key: x}
        return (x, *args[1:]), kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """What the adapter adds to the base's output for its input ``x``."""
        x = self._input(x)
        stash, self._stash = self._stash, None
        a, weights = stash if stash is not None else self._weights()
        u = torch.nn.functional.linear(x, a)
        if stash is None:  # (with it, _SumGradsOverTP sums the gradients over TP)
            u = self._over_tp(u)
        outs = [torch.nn.functional.linear(piece, b)
                for piece, (_, b) in zip(u.split(self.rank, dim=-1), weights)]
        return self._fused(outs) * self.scaling

    def _over_tp(self, u: torch.Tensor) -> torch.Tensor:
        """``x A^T`` as B takes it: gathered over the sequence (column-parallel base, SP),
        its gradient all-reduced (column, no SP), summed over TP (row-parallel base), or
        reduce-scattered over the sequence (row, SP)."""
        if self.column:
            return (gather_from_sequence_parallel_region(u, group=self.tp_group)
                    if self.sequence_parallel
                    else copy_to_tensor_model_parallel_region(u, group=self.tp_group))
        return (reduce_scatter_to_sequence_parallel_region(u, group=self.tp_group)
                if self.sequence_parallel
                else reduce_from_tensor_model_parallel_region(u, group=self.tp_group))

    def _fused(self, outs: List[torch.Tensor]) -> torch.Tensor:
        """The projections' outputs in the base's output layout."""
        if self.groups is None:  # [gate; up], or one projection
            return torch.cat(outs, dim=-1)
        lead = outs[0].shape[:-1]
        per_group = [o.reshape(*lead, self.groups, -1) for o in outs]  # q, k, v per group
        return torch.cat(per_group, dim=-1).reshape(*lead, -1)

    def _add(self, module, args, output):
        out, bias = output
        # through the adapter's call, as the base's own forward goes through the base's
        return out + self(args[0]).to(out.dtype), bias

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """A and B as ShardedTensors: split where they are split (resharded on load),
        replicated over TP elsewhere."""
        if getattr(self, self.parts[0]).fresh:  # not in the checkpoint being loaded
            return {}
        axes = {f"{p}.{'lora_B' if self.column else 'lora_A'}": 0 if self.column else 1
                for p in self.parts} if self.tp_size > 1 else {}
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True), prefix, axes, sharded_offsets,
            tp_group=self.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"))


class _SumGradsOverTP(torch.autograd.Function):
    """Identity on (x, A); backward: both gradients summed over ``group`` in one
    all-reduce (``LoraAdapter.shared_input``)."""

    @staticmethod
    def forward(ctx, x, a, group):
        ctx.group = group
        ctx.set_materialize_grads(False)
        return x, a

    @staticmethod
    def backward(ctx, grad_x, grad_a):
        grads = [g for g in (grad_x, grad_a) if g is not None]
        if not grads:
            return None, None, None
        flat = torch.cat([g.reshape(-1).to(grads[0].dtype) for g in grads])
        torch.distributed.all_reduce(flat, group=ctx.group)
        out, start = [], 0
        for g in (grad_x, grad_a):
            if g is not None:
                out.append(flat[start:start + g.numel()].view_as(g).to(g.dtype))
                start += g.numel()
            else:
                out.append(None)
        return out[0], out[1], None


def _adapter_for(name: str, base, parent, wanted: Tuple[str, ...],
                 settings: LoraConfig) -> Optional[LoraAdapter]:
    parts = parts_of(name, parent)
    trained = tuple(p for p in parts if p in wanted)
    if not trained:
        return None
    if not isinstance(base, (ColumnParallelLinear, RowParallelLinear)):
        raise ConfigError(f"LoRA needs Megatron-Core's local linears; {name} is "
                          f"{type(base).__name__} (pass --transformer-impl local)")
    rows, groups = base.weight.shape[0], None
    if name == "linear_qkv":  # per key/value group: [q heads, k, v]
        config = parent.config
        tp = base.tp_group.size() if base.tp_group is not None else 1
        groups = config.num_query_groups // tp
        kv_rows = groups * config.kv_channels
        sizes = [rows - 2 * kv_rows, kv_rows, kv_rows]
    else:  # [gate; up] halves, or one projection
        sizes = [rows // len(parts)] * len(parts)
    return LoraAdapter(base, parts, sizes, groups, settings, trained)


def apply_lora(model, settings: LoraConfig) -> List[str]:
    """Adapters on the targets of every module of ``model`` (a MultimodalModel chunk)
    that ``settings`` names; that module's other weights stop requiring gradients.
    Returns the adapters' names."""
    added = []
    for top, wanted in settings.modules().items():
        module = getattr(model, top, None)
        if module is None:  # not on this pipeline stage
            continue
        for p in module.parameters():
            p.requires_grad_(False)
        for prefix, parent in list(module.named_modules()):
            for name, base in list(parent.named_children()):
                adapter = _adapter_for(name, base, parent, wanted, settings)
                if adapter is not None:
                    parent.add_module(name + SUFFIX, adapter)
                    added.append(f"{top}.{prefix}.{name}{SUFFIX}".replace("..", "."))
    return added


def lora_adapters(model):
    """(name, adapter) of every LoRA adapter in ``model``."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraAdapter)]


def is_lora_parameter(name: str) -> bool:
    return ".lora_A" in name or ".lora_B" in name


def keep_fresh_adapters(chunks, fresh: bool = True) -> int:
    """Mark the adapters of ``chunks`` as absent from the checkpoint about to load (their
    initial values stay; loading clears the mark); returns how many."""
    pairs = [getattr(a, p) for chunk in chunks for _, a in lora_adapters(chunk)
             for p in a.parts]
    for pair in pairs:
        pair.fresh = fresh
    return len(pairs)

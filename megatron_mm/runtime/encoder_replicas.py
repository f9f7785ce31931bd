"""Encoder replicas inside the LLM's tensor-parallel groups (Optimus' own encoder TP plan).

With ``--encoder-tensor-model-parallel-size`` e dividing ``--tensor-model-parallel-size``
t (e < t), each LLM TP group of ranks ``g_0 .. g_{t-1}`` holds r = t / e replicas of the
encoder's pieces: replica j is the encoder-TP group ``g_{j*e} .. g_{j*e+e-1}`` and runs the
``EF`` / ``EB`` actions of the micro-batches it owns (``plan.encoder_pipeline.
encoder_replica_of``), so the replicas work concurrently, each with less TP traffic. The
encoder's output norm and the projector stay at TP = t and run on every rank with LLM
chunk 0. Three partitions of the world into groups, made once after Megatron-Core's own
(every rank creates every group, in the same order):

- encoder TP groups: each LLM TP group cut into r blocks of e consecutive ranks (the
  encoder layers' tensor parallelism);
- replica groups: per LLM TP group and encoder-TP rank k, ``[g_{j*e+k} for j < r]``: the
  same shard of the same layers on every replica, whose gradients are summed over it;
- encoder data-parallel groups: the ranks with the same pipeline (and context-parallel)
  rank and encoder-TP rank k, over all data-parallel ranks and all replicas: the
  checkpoint's replica ids, so each encoder shard has one main copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..plan.schedules.encoder_pipeline import encoder_replica_of
from .mailbox import Spec, allocate, spec_of

RankInfo = Tuple[Tuple[int, ...], int, int]  # (LLM TP group's ranks, pipeline rank, CP rank)


def encoder_group_ranks(infos: Sequence[RankInfo], encoder_tp: int
                        ) -> Tuple[List[List[int]], List[List[int]], List[List[int]]]:
    """(encoder TP groups, replica groups, encoder data-parallel groups) as global rank
    lists, from every rank's ``infos`` (indexed by global rank); the same on every rank."""
    tp_groups = sorted({tuple(info[0]) for info in infos})
    t = len(tp_groups[0])
    if encoder_tp < 1 or t % encoder_tp:
        raise ValueError(f"encoder TP {encoder_tp} does not divide TP {t}")
    r = t // encoder_tp
    encoder_tp_groups = [list(g[j * encoder_tp:(j + 1) * encoder_tp])
                         for g in tp_groups for j in range(r)]
    replica_groups = [[g[j * encoder_tp + k] for j in range(r)]
                      for g in tp_groups for k in range(encoder_tp)]
    data_parallel: Dict[Tuple[int, int, int], List[int]] = {}
    for rank, (group, pp_rank, cp_rank) in enumerate(infos):
        k = list(group).index(rank) % encoder_tp
        data_parallel.setdefault((pp_rank, cp_rank, k), []).append(rank)
    return encoder_tp_groups, replica_groups, [data_parallel[key] for key in
                                               sorted(data_parallel)]


@dataclass
class EncoderReplicas:
    """This rank's encoder replica (``index`` of ``replicas``) and its groups."""

    replicas: int
    index: int
    tensor_model_parallel_size: int  # e
    tp_group: dist.ProcessGroup  # encoder TP: this replica's e ranks
    replica_group: dist.ProcessGroup  # this shard on every replica of the LLM TP group
    data_parallel_group: dist.ProcessGroup  # checkpoint replica ids of the encoder
    llm_tp_group: dist.ProcessGroup
    first_ranks: List[int]  # global rank of each replica's encoder-TP rank 0

    def owns(self, microbatch: int) -> bool:
        """Whether this replica runs ``microbatch``'s encoder forward and backward."""
        return encoder_replica_of(microbatch, self.replicas) == self.index

    def share_output(self, microbatch: int, tensor: Optional[torch.Tensor],
                     spec: Optional[Spec], device: torch.device) -> Optional[torch.Tensor]:
        """The encoder output of ``microbatch`` on every rank of the LLM TP group: sent by
        the owner replica's first rank (``tensor`` there), a new tensor of ``spec`` (what
        every rank knows from the micro-batch; None: no media, nothing travels) elsewhere.
        Every rank of the group calls it, in the same order: one broadcast, no header."""
        if spec is None:
            return None
        src = self.first_ranks[encoder_replica_of(microbatch, self.replicas)]
        if dist.get_rank() == src:
            if spec_of(tensor) != spec:
                raise RuntimeError(f"encoder output of micro-batch {microbatch} is "
                                   f"{spec_of(tensor)}, its receivers expect {spec}")
            out = tensor.detach().contiguous()
        else:
            out = allocate(spec, device)
        if out.numel():
            dist.broadcast(out, src=src, group=self.llm_tp_group)
        return out

    def reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients (``main_grad``) of the encoder pieces over the replicas: each
        computed those of its own micro-batches."""
        grads = [p.main_grad for p in params
                 if p.requires_grad and getattr(p, "main_grad", None) is not None]
        if grads:
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=self.replica_group)
            for grad, summed in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(summed)

    def sync_params(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replica 0's values on every replica (weights initialised on the GPU draw from
        per-TP-rank streams, which differ between replicas)."""
        tensors = [p.data for p in params]
        if tensors:
            flat = _flatten_dense_tensors(tensors)
            dist.broadcast(flat, src=dist.get_process_group_ranks(self.replica_group)[0],
                           group=self.replica_group)
            for tensor, synced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                tensor.copy_(synced)

    def mark_duplicates(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Count each encoder shard once in the gradient norm: Megatron-Core skips a param
        marked ``shared`` (as tied embeddings are), so replicas j > 0 mark theirs."""
        if self.index > 0:
            for p in params:
                p.shared = True


def create_encoder_replicas(encoder_tp: int) -> Optional[EncoderReplicas]:
    """The groups for encoder TP ``encoder_tp`` (after ``initialize_model_parallel``); None
    when it equals the LLM's TP (one replica: the LLM's groups serve). Every rank calls."""
    llm_tp = parallel_state.get_tensor_model_parallel_group()
    tp_ranks = tuple(dist.get_process_group_ranks(llm_tp))
    if encoder_tp == len(tp_ranks):
        return None
    info: RankInfo = (tp_ranks, parallel_state.get_pipeline_model_parallel_rank(),
                      parallel_state.get_context_parallel_rank())
    infos: List[Optional[RankInfo]] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, info)
    tp_lists, replica_lists, dp_lists = encoder_group_ranks(infos, encoder_tp)
    tp_group, _ = dist.new_subgroups_by_enumeration(tp_lists)
    replica_group, _ = dist.new_subgroups_by_enumeration(replica_lists)
    dp_group, _ = dist.new_subgroups_by_enumeration(dp_lists)
    position = tp_ranks.index(dist.get_rank())
    return EncoderReplicas(
        replicas=len(tp_ranks) // encoder_tp, index=position // encoder_tp,
        tensor_model_parallel_size=encoder_tp, tp_group=tp_group, replica_group=replica_group,
        data_parallel_group=dp_group, llm_tp_group=llm_tp,
        first_ranks=list(tp_ranks[::encoder_tp]))

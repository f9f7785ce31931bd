"""The keywords of Megatron-Core 0.19.2's forward-backward functions, as the schedule
executor takes them (``pipeline_parallel/schedules.py``: ``forward_backward_no_pipelining``
and the two pipelined ones share one signature). Each is honoured or refused with one
error that names it; none is dropped:

- ``forward_step_func``, ``data_iterator`` (one, or one per model chunk; ``None`` on a
  stage that reads no data, ``microbatches.py``), ``model``, ``num_microbatches``,
  ``forward_only``, ``collect_non_loss_data``: as there;
- ``seq_length``, ``micro_batch_size``: as Megatron-Core's ``get_tensor_shapes``, the shape
  [S, B, H] of the LLM's messages (S over the TP size under sequence parallelism) where
  the model's config has no ``variable_seq_lengths``: a stage without data sizes its
  messages so, and each micro-batch read must have that shape; with
  ``variable_seq_lengths`` each stage sizes each message from its own micro-batch;
- ``first_val_step``: as Megatron-Core's ``check_first_val_step`` (whether a forward-only
  call's first micro-batch re-casts FP8 weights);
- ``pg_collection``: its pipeline group carries the messages (it must hold the ranks of
  Megatron-Core's pipeline group, on which the model was built) and it goes on to
  ``finalize_model_grads``; a ``MultiModuleProcessGroupCollection`` (MIMO's per-module
  grids) is refused;
- ``p2p_communicator``: its ``pp_group`` carries the messages (the same ranks again);
- ``force_all_reduce``: handed to ``finalize_model_grads`` (an all-reduce instead of the
  distributed optimizer's reduce-scatter), as there;
- ``decoder_seq_length`` (encoder-decoder models) and ``adjust_tensor_shapes_fn``
  (ModelOpt distillation's message shapes) are refused: the encoder schedules run a
  decoder-only LLM and size each message from its micro-batch.

The schedule behaviour Megatron-LM sets on the model's config (``check_config``):
``param_sync_func``, ``no_sync_func``, ``finalize_model_grads_func`` and
``defer_embedding_wgrad_compute`` are honoured by the executor; a config asking for what
only Megatron-Core's own schedules do is refused at the call, one error naming the flag:
``--overlap-moe-expert-parallel-comm`` and ``--delay-wgrad-compute`` (the combined 1F1B
schedule that overlaps one micro-batch's expert all-to-alls with another's compute, and
calls TE's deferred weight-gradient GEMMs, ``backward_dw``), ``--cuda-graph-impl
full_iteration`` (one CUDA graph of the whole forward-backward call on static buffers:
media batches change shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch.distributed as dist


class ScheduleCallError(ValueError):
    """A keyword of the call the encoder schedules cannot honour."""


@dataclass
class ScheduleCall:
    """The honoured keywords of one call (module docstring)."""

    seq_length: Optional[int] = None
    micro_batch_size: Optional[int] = None
    forward_only: bool = False
    collect_non_loss_data: bool = False
    first_val_step: Optional[bool] = None
    pg_collection: Any = None
    force_all_reduce: bool = False
    group: Any = None  # the group the messages travel in (None: the executor's own)

    def is_first_microbatch(self, cond: bool) -> bool:
        """Megatron-Core's ``check_first_val_step``."""
        if self.first_val_step is not None and self.forward_only:
            return self.first_val_step and cond
        return cond


def check_config(config) -> None:
    """Refuse what the model's config asks of the schedule that the executor cannot do
    (module docstring)."""
    if getattr(config, "overlap_moe_expert_parallel_comm", False):
        raise ScheduleCallError(
            "--overlap-moe-expert-parallel-comm needs Megatron-Core's combined 1F1B schedule "
            "(one micro-batch's expert all-to-alls under another's compute"
            + (", and TE's deferred weight gradients of --delay-wgrad-compute"
               if getattr(config, "delay_wgrad_compute", False) else "")
            + "); the encoder schedules run one action at a time: use --encoder-schedule "
            "megatron or leave it off")
    if getattr(config, "delay_wgrad_compute", False):
        raise ScheduleCallError(
            "--delay-wgrad-compute: TE's deferred weight gradients run only in Megatron-Core's "
            "combined 1F1B schedule (--overlap-moe-expert-parallel-comm); the encoder "
            "schedules would never compute them: leave it off")
    if getattr(config, "cuda_graph_impl", "none") == "full_iteration":
        raise ScheduleCallError(
            "--cuda-graph-impl full_iteration captures the whole forward-backward call on "
            "static buffers, which cannot hold media batches of changing shapes: leave "
            "it unset")


def _ranks(group) -> list:
    return dist.get_process_group_ranks(group)


def check_call(own_group: Callable, *, seq_length=None, micro_batch_size=None,
               decoder_seq_length=None, forward_only=False, collect_non_loss_data=False,
               first_val_step=None, adjust_tensor_shapes_fn: Optional[Callable] = None,
               p2p_communicator=None, pg_collection=None,
               force_all_reduce=False) -> ScheduleCall:
    """The call's keywords checked against the executor's message group (``own_group()``,
    read only when a keyword names a group)."""
    if decoder_seq_length is not None:
        raise ScheduleCallError(
            f"forward_backward_func(decoder_seq_length={decoder_seq_length}): the encoder "
            "schedules run a decoder-only LLM (leave --decoder-seq-length unset)")
    if adjust_tensor_shapes_fn is not None:
        raise ScheduleCallError(
            "forward_backward_func(adjust_tensor_shapes_fn=...): the encoder schedules size "
            "each message from its micro-batch; ModelOpt distillation's shape adjustment "
            "needs Megatron-Core's schedules (--encoder-schedule megatron)")
    group = None
    if pg_collection is not None:
        from megatron.core.process_groups_config import MultiModuleProcessGroupCollection
        if isinstance(pg_collection, MultiModuleProcessGroupCollection):
            raise ScheduleCallError(
                "forward_backward_func(pg_collection=MultiModuleProcessGroupCollection): the "
                "encoder schedules run one grid; MIMO's per-module grids need "
                "--encoder-schedule megatron")
        group = _same_ranks(pg_collection.pp, own_group(), "pg_collection.pp")
    if p2p_communicator is not None:
        theirs = _same_ranks(p2p_communicator.pp_group, own_group(),
                             "p2p_communicator.pp_group")
        group = group if group is not None else theirs
    return ScheduleCall(seq_length, micro_batch_size, bool(forward_only),
                        bool(collect_non_loss_data), first_val_step, pg_collection,
                        bool(force_all_reduce), group)


def _same_ranks(group, own_group, name: str):
    if _ranks(group) != _ranks(own_group):
        raise ScheduleCallError(
            f"forward_backward_func({name}): ranks {_ranks(group)}, but the schedule's "
            f"messages travel among {_ranks(own_group)} (Megatron-Core's pipeline group, on "
            "which the model chunks were built)")
    return group

"""The executor's micro-batches (read lazily, in order, the per-chunk copies in step; a
stage without an iterator refused with what needed the batch) and the forward-backward
keywords it honours as Megatron-Core does."""

import itertools

import pytest
from megatron.core.pipeline_parallel.schedules import check_first_val_step

from megatron_mm.runtime.microbatches import Microbatches, NoData
from megatron_mm.runtime.schedule_call import ScheduleCall, ScheduleCallError, check_call


def _counting(n, log, name):
    for i in range(n):
        log.append((name, i))
        yield {"m": i}


def test_read_in_order_on_first_use_copies_in_step():
    log = []
    batches = Microbatches([_counting(4, log, "a"), None, _counting(4, log, "b")], 4, rank=0)
    assert log == []  # nothing read up front
    assert batches[2] == {"m": 2}  # the ones before it first, each copy in step
    assert log == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert batches[0] == {"m": 0} and len(log) == 6  # read once
    batches.finish()  # what no action needed: one per micro-batch, as Megatron-Core reads
    assert log[-2:] == [("a", 3), ("b", 3)]


def test_a_stage_without_iterators_says_what_needed_the_batch():
    batches = Microbatches([None, None], 4, rank=1)
    assert not batches.has_data and batches.get(0) is None
    batches.finish()  # nothing to read
    with pytest.raises(NoData, match="pipeline rank 1 was given no data iterator.*"
                                     "micro-batch 3"):
        batches[3]


def test_first_val_step_as_megatron_core():
    for first, forward_only, cond in itertools.product((None, True, False), (True, False),
                                                       (True, False)):
        call = ScheduleCall(forward_only=forward_only, first_val_step=first)
        assert call.is_first_microbatch(cond) == check_first_val_step(first, forward_only, cond)


def test_refused_before_any_group_is_read():
    with pytest.raises(ScheduleCallError, match="decoder_seq_length=128.*decoder-only"):
        check_call(None, decoder_seq_length=128)
    with pytest.raises(ScheduleCallError, match="adjust_tensor_shapes_fn.*ModelOpt"):
        check_call(None, adjust_tensor_shapes_fn=lambda recv, send: (recv, send))
    call = check_call(None, seq_length=64, micro_batch_size=2, forward_only=True,
                      collect_non_loss_data=True, first_val_step=False, force_all_reduce=True)
    assert (call.seq_length, call.micro_batch_size, call.forward_only, call.collect_non_loss_data,
            call.first_val_step, call.force_all_reduce, call.group) == (
        64, 2, True, True, False, True, None)

"""The mailbox's strict mode (``MEGATRON_MM_STRICT_P2P=1``): sends wait for their receives
as NCCL's do, so a send/send cycle that hangs on NCCL times out on gloo, while the same
messages batched into one exchange (or without strict mode) go through. Without it, a
received message is waited for when taken, for the works that carry it: its receive's
alone on gloo (one per op), the batch's ONE on NCCL (emulated:
``runtime/nccl_coalescing.py``)."""

import os

import pytest
import torch
import torch.distributed as dist

from dist_harness import NCCL_COALESCING, run_distributed
from megatron_mm.runtime import mailbox
from megatron_mm.runtime.mailbox import Mailbox, P2PTimeout, Spec


def _exchange(rank, strict, batched, mismatch=False):
    os.environ.update(MEGATRON_MM_STRICT_P2P="1" if strict else "0",
                      MEGATRON_MM_STRICT_P2P_TIMEOUT="3")
    dist.init_process_group("gloo")
    box = Mailbox(dist.group.WORLD, torch.device("cpu"))
    peer, spec = 1 - rank, Spec((64, 32), torch.float32)
    mine = torch.full(spec.shape, float(rank))
    send = [(peer, ("F", 0, rank), mine[:, :16] if mismatch else mine, spec)]
    recv = [(peer, ("F", 0, peer), spec)]
    try:
        if batched:
            got = box.exchange(send, recv)
        else:  # both ranks send first, then receive: rank 0 sends F, rank 1 sends B
            box.exchange(send, [])
            got = box.exchange([], recv)
        box.finish()
    except P2PTimeout as e:
        return f"timeout: {e}"
    except RuntimeError as e:
        return f"error: {e}"
    return float(got[("F", 0, peer)].mean())


@pytest.mark.processes
def test_strict_mode_times_out_on_a_send_send_cycle():
    for out in run_distributed(_exchange, 2, True, False):
        assert out.startswith("timeout") and "On NCCL this order hangs" in out, out


@pytest.mark.processes
@pytest.mark.parametrize("strict, batched, env", [
    (False, False, None), (True, True, None), (False, True, NCCL_COALESCING)],
    ids=["buffered-sends", "strict-batched", "nccl-coalescing"])
def test_the_same_messages_go_through(strict, batched, env):
    assert run_distributed(_exchange, 2, strict, batched, env=env) == [1.0, 0.0]


@pytest.mark.processes
def test_a_send_unlike_its_spec_is_an_error_naming_the_message():
    for rank, out in enumerate(run_distributed(_exchange, 2, True, True, True)):
        assert out.startswith(f"error: pipeline message ('F', 0, {rank}) to pipeline rank "
                              f"{1 - rank} is Spec(shape=(64, 16)"), out


def _late_sender(rank):
    import time

    os.environ["MEGATRON_MM_STRICT_P2P"] = "0"
    dist.init_process_group("gloo")
    box = Mailbox(dist.group.WORLD, torch.device("cpu"))
    spec, key, back = Spec((256,), torch.float32), ("F", 0, 0), ("B", 0, 0)
    if rank == 0:
        time.sleep(0.5)  # the message is still on its way when rank 1's exchange returns
        box.exchange([(1, key, torch.full(spec.shape, 7.0), spec)], [(1, back, spec)])
        box.finish()
        return None
    # a send and a receive in one batch: one Work for both on NCCL
    got = box.exchange([(0, back, torch.ones(spec.shape), spec)], [(0, key, spec)])[key]
    box.take(key)  # waits here, just before the message is used
    value = float(got.mean())
    box.finish()
    return value


@pytest.mark.processes
@pytest.mark.parametrize("env", [None, NCCL_COALESCING], ids=["gloo", "nccl-coalescing"])
def test_a_receive_is_waited_for_when_it_is_taken(env):
    assert run_distributed(_late_sender, 2, env=env)[1] == 7.0


def _send_received_later(rank):
    """Rank 1 takes a message whose batch also carries a send that rank 0 receives only
    once rank 1 has taken it (rank 0 posts that receive when the store says so, or when
    waiting for that ran out): the take must not wait for the send."""
    import datetime

    os.environ["MEGATRON_MM_STRICT_P2P"] = "0"
    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    box = Mailbox(dist.group.WORLD, torch.device("cpu"))
    spec, key, back = Spec((1 << 18,), torch.float32), ("F", 0, 0), ("B", 0, 0)  # 1 MB
    if rank == 1:
        got = box.exchange([(0, back, torch.ones(spec.shape), spec)], [(0, key, spec)])[key]
        box.take(key)
        store.set("taken", "1")
        value = float(got.mean())
        box.finish()
        return value
    box.exchange([(1, key, torch.full(spec.shape, 7.0), spec)], [])
    try:
        store.wait(["taken"], datetime.timedelta(seconds=20))
        taken = True
    except Exception:  # the take waited for the send: let it finish
        taken = False
    box.exchange([], [(1, back, spec)])
    box.finish()
    return taken


@pytest.mark.processes
def test_a_take_does_not_wait_for_its_batchs_sends_on_gloo():
    assert run_distributed(_send_received_later, 2) == [True, 7.0]


class _CoalescedBatch(dist.Work):
    """NCCL's contract for a fake backend: one Work per batch, the received tensors filled
    (with the batch's number) only by its wait."""

    def __init__(self, number, ops, waited):
        super().__init__()
        self.number, self.ops, self.waited = number, ops, waited

    def wait(self, timeout=None):
        self.waited.append(self.number)
        for op in self.ops:
            if op.op is dist.irecv:
                op.tensor.fill_(self.number)
        return True


def test_a_take_waits_for_its_batchs_one_work(monkeypatch):
    waited, batches = [], []

    def coalesced(ops):  # batches numbered 1, 2, ...
        batches.append(ops)
        return [_CoalescedBatch(len(batches), ops, waited)]

    monkeypatch.setattr(mailbox, "batch_isend_irecv", coalesced)
    monkeypatch.setenv("MEGATRON_MM_STRICT_P2P", "0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        box, spec = Mailbox(dist.group.WORLD, torch.device("cpu")), Spec((4,), torch.float32)
        first = box.exchange([(0, ("B", 0, 1), torch.ones(4), spec)],
                             [(0, ("F", 0, 0), spec), (0, ("F", 1, 0), spec)])
        second = box.exchange([], [(0, ("F", 2, 0), spec)])
        box.take(("F", 1, 0))  # its batch also carries a send and another receive
        assert waited == [1] and float(first[("F", 1, 0)].mean()) == 1
        box.take(("F", 0, 0))  # the same batch: already waited for
        assert waited == [1] and float(first[("F", 0, 0)].mean()) == 1
        box.finish()
        assert waited == [1, 2] and float(second[("F", 2, 0)].mean()) == 2
    finally:
        dist.destroy_process_group()

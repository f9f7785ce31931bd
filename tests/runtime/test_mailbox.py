"""The mailbox's strict mode (``MEGATRON_MM_STRICT_P2P=1``): sends wait for their receives
as NCCL's do, so a send/send cycle that hangs on NCCL times out on gloo, while the same
messages batched into one exchange (or without strict mode) go through."""

import os

import pytest
import torch

from dist_harness import run_distributed


def _exchange(rank, strict, batched, mismatch=False):
    import torch.distributed as dist

    from megatron_mm.runtime.mailbox import Mailbox, P2PTimeout, Spec

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


def test_strict_mode_times_out_on_a_send_send_cycle():
    for out in run_distributed(_exchange, 2, True, False):
        assert out.startswith("timeout") and "On NCCL this order hangs" in out, out


@pytest.mark.parametrize("strict, batched", [(False, False), (True, True)],
                         ids=["buffered-sends", "strict-batched"])
def test_the_same_messages_go_through(strict, batched):
    assert run_distributed(_exchange, 2, strict, batched) == [1.0, 0.0]


def test_a_send_unlike_its_spec_is_an_error_naming_the_message():
    for rank, out in enumerate(run_distributed(_exchange, 2, True, True, True)):
        assert out.startswith(f"error: pipeline message ('F', 0, {rank}) to pipeline rank "
                              f"{1 - rank} is Spec(shape=(64, 16)"), out


def _late_sender(rank):
    import time

    import torch.distributed as dist

    from megatron_mm.runtime.mailbox import Mailbox, Spec

    os.environ["MEGATRON_MM_STRICT_P2P"] = "0"
    dist.init_process_group("gloo")
    box = Mailbox(dist.group.WORLD, torch.device("cpu"))
    spec, key = Spec((256,), torch.float32), ("F", 0, 0)
    if rank == 0:
        time.sleep(0.5)  # the message is still on its way when rank 1's exchange returns
        box.exchange([(1, key, torch.full(spec.shape, 7.0), spec)], [])
        box.finish()
        return None
    got = box.exchange([], [(0, key, spec)])[key]
    box.take(key)  # waits here, just before the message is used
    value = float(got.mean())
    box.finish()
    return value


def test_a_receive_is_waited_for_when_it_is_taken():
    assert run_distributed(_late_sender, 2)[1] == 7.0

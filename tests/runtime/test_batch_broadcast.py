"""The first tensor-parallel rank's micro-batches broadcast to the others
(``runtime/batch_broadcast.py``), over two gloo ranks in one launch: what rank 1 receives
equals what it would have read itself (every tensor by value, dtype and shape, the media,
the Python lists), padded with M-RoPE positions, packed and text-only batches alike; a
stage that reads no media contents gets stand-ins of their shape holding no memory; only
rank 0 builds the iterator; the end of the data and a failure reading on rank 0 reach
rank 1 (a StopIteration, an error naming the failure), not a hang; an Energon loader's
state (what checkpoints save) is rank 0's. On an NCCL-like group
(its tensors on another device: torch's lazy device, host tensors refused as NCCL does)
the media contents go on that device and stay there, the host values over a gloo group."""

import pytest
from dist_harness import run_distributed
from tp_batch_runs import broadcast_cases

from megatron_mm.runtime.batch_broadcast import BatchBroadcastError
from megatron_mm.training.errors import peer_stopped

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def cases():
    return run_distributed(broadcast_cases, 2)


@pytest.mark.parametrize("name", ["contents", "shapes_only", "nccl_like"])
def test_received_batches_equal_what_the_rank_reads(cases, name):
    for rank, out in enumerate(cases):
        case = out[name]
        assert case["diffs"] == [], (rank, case["diffs"])
        assert (case["read"], case["ended"]) == (3, "stop"), (rank, case)
        # only the first rank made the iterator (no loader, no decoding elsewhere)
        assert (case["made"], case["batches"]) == ((1, 3) if rank == 0 else (0, 0)), case


def test_nccl_like_group_takes_device_tensors_only(cases):
    # per batch sizes and header over gloo (and the end's sizes); media contents (two
    # batches have them) on the NCCL-like group
    for out in cases:
        assert out["nccl_like"]["collectives"] == {"host": 3 * 2 + 1, "device": 2}, out


def test_the_loader_state_is_the_first_ranks(cases):
    # the rank that saves it (tensor, pipeline and context-parallel rank 0) reads it
    assert [out["savable"] for out in cases] == [{"rank": 0}, None]


def test_failure_on_the_first_rank_reaches_the_others(cases):
    first, other = cases[0]["failure"], cases[1]["failure"]
    assert first["ended"] == "ValueError: record 17 of a.jsonl: image not found", first
    assert other["ended"].startswith("BatchBroadcastError: tensor-parallel rank 0"), other
    assert "record 17 of a.jsonl: image not found" in other["ended"], other
    assert first["read"] == other["read"] == 1 and first["diffs"] == other["diffs"] == []
    # the scripts stop the receivers without a word: the reading rank says why
    assert peer_stopped(BatchBroadcastError(other["ended"]))

"""The separate placement's processes (runtime/separate_placement.py): Megatron-Core's
groups for the LLM at the encoders' rank offset, and the program's exchanges between
encoder and LLM ranks in real processes with sends that wait for their receives (strict
mode, as NCCL's do): every message arrives, at the rank the program says, with its
payload."""

import pytest
import torch

from dist_harness import run_distributed
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.p2p import message_inputs
from megatron_mm.plan.schedules.separate import placement_sizes, separate
from megatron_mm.runtime.mailbox import Spec

SPEC = Spec((2, 3), torch.float32)


def _payload(key):
    kind, g, c = key
    return torch.full(SPEC.shape, float(len(kind) * 1000 + 10 * g + c))


def _walk(rank, world, pp, edp, m, trainable):
    import torch.distributed as dist
    from megatron.core import parallel_state

    from megatron_mm.runtime.separate_placement import (ProgramWalk, SeparateRanks,
                                                         initialize_separate_parallel)

    dist.init_process_group("gloo")
    sizes = placement_sizes(world, 1, pp, 1, 1, edp)
    ranks = SeparateRanks(sizes, 1, pp, 1)
    groups = initialize_separate_parallel(ranks)
    live = _live_groups(parallel_state)
    if ranks.is_encoder(rank):
        # a grid of their own: one stage, data-parallel over the encoder replicas
        assert parallel_state.get_pipeline_model_parallel_world_size() == 1
        assert dist.get_process_group_ranks(
            parallel_state.get_data_parallel_group()) == list(range(edp))
        seen = dist.get_process_group_ranks(groups.encoder_data_parallel_group)
    else:
        seen = dist.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group())
        assert parallel_state.get_data_parallel_world_size() == sizes.llm_data_parallel_size
    s = separate(ScheduleProblem(pp, m, llm_data_parallel_size=sizes.llm_data_parallel_size,
                                 encoder_data_parallel_size=edp, encoder_trainable=trainable,
                                 encoders=2, frozen_encoders=[1]))
    produced = {}  # action key -> the messages it sends
    for r, actions in enumerate(s.ranks):
        for a in actions:
            for key, producer in message_inputs(s, a):
                produced.setdefault(producer.key, []).append(key)
    walk = ProgramWalk(s, ranks, lambda key: SPEC, torch.device("cpu"))
    checked = []

    def step(a, inputs):
        for key, tensor in inputs.items():
            assert torch.equal(tensor, _payload(key)), (a, key, tensor)
            checked.append(tuple(key))
        return {key: _payload(key) for key in produced.get(a.key, [])}

    walk.run(step)
    return seen, sorted(checked), live


def _live_groups(parallel_state):
    """Each group of this rank's grid, the gloo ones among them (the distributed
    optimizer's ``data_parallel_group_gloo``), used as the optimizer uses it: its ranks
    from torch's registry, a gather to its first rank (``get_parameter_state_dp_zero``)
    and an all-reduce of ones; {name: (the sum, its size)}. A group
    ``destroy_process_group`` unregistered fails: torch looks its ranks up."""
    import torch.distributed as dist

    groups = {k: v for k, v in vars(parallel_state).items()
              if k.startswith("_") and k[1:2].isupper() and isinstance(v, dist.ProcessGroup)}
    ones, works = {k: torch.ones(1) for k in groups}, []
    for k, g in sorted(groups.items()):  # async: no group's collective waits on another's
        first = dist.get_process_group_ranks(g)[0]
        mine = dist.get_rank() == first
        works.append(dist.gather(torch.ones(1), [torch.empty(1) for _ in range(g.size())]
                                 if mine else None, dst=first, group=g, async_op=True))
        works.append(dist.all_reduce(ones[k], group=g, async_op=True))
    for w in works:
        w.wait()
    assert "_DATA_PARALLEL_GROUP_GLOO" in groups
    return {k: (int(ones[k].item()), g.size()) for k, g in groups.items()}


@pytest.mark.processes
@pytest.mark.parametrize("world, pp, edp, trainable", [(3, 2, 1, True), (4, 2, 2, False),
                                                       (5, 2, 1, True)],
                         ids=["1-encoder-rank-llm-pp2", "2-encoder-ranks-llm-pp2-frozen",
                              "1-encoder-rank-llm-pp2-dp2"])
def test_the_program_runs_between_encoder_and_llm_ranks(world, pp, edp, trainable):
    m = 3
    out = run_distributed(_walk, world, world, pp, edp, m, trainable)
    llm_dp = (world - edp) // pp
    # the groups: encoder ranks first, the LLM's pipelines at the rank offset
    for rank, (group, _, live) in enumerate(out):
        assert all(got == size for got, size in live.values()), (rank, live)
        if rank < edp:
            assert group == list(range(edp))
        else:
            d = (rank - edp) % llm_dp
            assert group == [edp + d + llm_dp * r for r in range(pp)]
    got = sorted(k for _, keys, _ in out for k in keys)
    g = range(llm_dp * m)
    expected = ([("EF", i, p) for i in g for p in (0, 1)]  # both encoders' outputs
                + [("F", i, 0) for i in g] + [("B", i, 1) for i in g]
                + ([("B", i, -1) for i in g] if trainable else []))  # trained encoder's grad
    assert got == sorted(expected)

"""What Megatron-LM sets on the model's config for its schedules, under the schedule
executor: ``param_sync_func`` dispatched once per model chunk ahead of its first forward
(``--overlap-param-gather`` with VPP), ``force_all_reduce`` handed to the early gradient
reduction, and the flags only Megatron-Core's own schedules can run refused by name."""

from types import SimpleNamespace

import pytest

from megatron_mm.plan.schedules.actions import Action
from megatron_mm.runtime.executor import _ParamSync, _start_grad_sync
from megatron_mm.runtime.schedule_call import ScheduleCallError, check_config

# rank 0 of PP=2 x VPP=3: chunks 0, 2, 4 (model chunks 0, 1, 2), encoder pieces in chunk 0
ACTIONS = [Action("EF", 0, 0), Action("F", 0, 0), Action("F", 0, 2), Action("EF", 1, 0),
           Action("F", 1, 0), Action("F", 0, 4), Action("B", 0, 4), Action("F", 1, 2),
           Action("F", 1, 4), Action("B", 1, 4), Action("B", 0, 2), Action("B", 1, 2),
           Action("B", 0, 0), Action("B", 1, 0), Action("EB", 0, 0), Action("EB", 1, 0)]


class _Chunk:
    def __init__(self, k):
        self.k = k

    def parameters(self):
        return f"params of {self.k}"


def _run(param_sync_func, forward_only=False, chunks=3):
    log = []
    model = [_Chunk(k) for k in range(chunks)]
    it = SimpleNamespace(model=model, forward_only=forward_only,
                         config=SimpleNamespace(param_sync_func=param_sync_func(log)),
                         s=SimpleNamespace(pipeline_model_parallel_size=2),
                         x=SimpleNamespace(owns=lambda a: True))
    sync = _ParamSync(it, ACTIONS)
    for i, a in enumerate(ACTIONS):
        sync.before(i)
        log.append(f"{a.kind}{a.microbatch}.{a.chunk}")
    return log


def test_each_chunk_gathered_once_ahead_of_its_first_forward():
    # Megatron-LM's list, one start_param_sync per chunk
    log = _run(lambda log: [lambda params, k=k: log.append(("sync", k, params))
                            for k in range(3)])
    syncs = [e for e in log if isinstance(e, tuple)]
    assert syncs == [("sync", 0, "params of 0"), ("sync", 1, "params of 1"),
                     ("sync", 2, "params of 2")]
    # chunks 0 and 1 before any action (as Megatron-Core's interleaved schedule); chunk 2
    # at chunk 1's first forward, F(0, 2), so it runs under that chunk's work
    assert log[:3] == syncs[:2] + ["EF0.0"]
    assert log[log.index("F0.0") + 1:log.index("F0.2") + 1] == [("sync", 2, "params of 2"),
                                                                "F0.2"]
    assert log.index(("sync", 2, "params of 2")) < log.index("F0.4")


def test_one_function_for_every_chunk_and_none_forward_only():
    seen = []
    _run(lambda log: lambda params: seen.append(params))  # Megatron-LM's one-chunk form
    assert seen == ["params of 0", "params of 1", "params of 2"]
    seen.clear()
    _run(lambda log: lambda params: seen.append(params), forward_only=True)
    assert seen == []  # Megatron-Core clears param_sync_func in forward-only calls
    assert _run(lambda log: None) == [f"{a.kind}{a.microbatch}.{a.chunk}" for a in ACTIONS]


class _BucketGroup:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def start_grad_sync(self, force_all_reduce=False):
        self.log.append((self.name, force_all_reduce))


def test_force_all_reduce_reaches_every_bucket_group():
    log = []
    chunk = SimpleNamespace(bucket_groups=[_BucketGroup(log, "a"), _BucketGroup(log, "b")],
                            expert_parallel_bucket_groups=[_BucketGroup(log, "expert")],
                            start_grad_sync=lambda: log.append("ddp"))
    _start_grad_sync(chunk, True)
    assert log == [("a", True), ("b", True), ("expert", True)]
    log.clear()
    _start_grad_sync(chunk, False)  # DDP's own start_grad_sync
    assert log == ["ddp"]


@pytest.mark.parametrize("settings, flag", [
    ({"overlap_moe_expert_parallel_comm": True}, "--overlap-moe-expert-parallel-comm"),
    ({"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
     "--delay-wgrad-compute"),
    ({"delay_wgrad_compute": True}, "--delay-wgrad-compute"),
    ({"cuda_graph_impl": "full_iteration"}, "--cuda-graph-impl full_iteration"),
])
def test_schedule_behaviour_only_megatron_core_runs_is_refused(settings, flag):
    config = SimpleNamespace(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False,
                             cuda_graph_impl="none")
    check_config(config)
    for name, value in settings.items():
        setattr(config, name, value)
    with pytest.raises(ScheduleCallError, match=flag):
        check_config(config)

"""--overlap-grad-reduce under the schedule executor: each chunk's gradient reduction
starts right after the last action adding to its gradients, hooks quiet until then."""

from contextlib import contextmanager
from types import SimpleNamespace

from megatron_mm.plan.schedules.actions import Action
from megatron_mm.runtime.executor import _OverlappedGradSync


class _Chunk:
    def __init__(self, k, log):
        self.k, self.log = k, log

    @contextmanager
    def no_sync(self):
        self.log.append(("quiet", self.k))
        yield
        self.log.append(("hooks on", self.k))

    def start_grad_sync(self):
        self.log.append(("start", self.k))


def _run(actions, replicas=None, forward_only=False):
    log = []
    chunks = [_Chunk(k, log) for k in range(2)]
    it = SimpleNamespace(model=chunks, forward_only=forward_only, replicas=replicas,
                         call=SimpleNamespace(force_all_reduce=False),
                         config=SimpleNamespace(no_sync_func=[c.no_sync for c in chunks]),
                         s=SimpleNamespace(pipeline_model_parallel_size=2))
    sync = _OverlappedGradSync(it, actions)
    for i, a in enumerate(actions):
        log.append(("run", f"{a.kind}{a.microbatch}.{a.chunk}"))
        sync.after(i)
    log.append(("end", None))
    sync.after(len(actions))
    return log


# rank 0 of PP=2 x VPP=2: chunks 0 and 2 (model chunks 0 and 1), encoder pieces in chunk 0
ACTIONS = [Action("EF", 0, 0), Action("F", 0, 0), Action("F", 0, 2), Action("B", 0, 2),
           Action("EF", 1, 0), Action("F", 1, 0), Action("F", 1, 2), Action("B", 1, 2),
           Action("B", 0, 0), Action("B", 1, 0), Action("EB", 0, 0), Action("EB", 1, 0)]


def test_each_chunk_starts_after_its_last_backward():
    log = _run(ACTIONS)
    assert log[:2] == [("quiet", 0), ("quiet", 1)]
    # model chunk 1 (virtual stage 1) is final after B(1, 2): its reduction overlaps the
    # rest; chunk 0 holds the encoder pieces, final after the last EB
    i = log.index(("run", "B1.2"))
    assert log[i + 1:i + 3] == [("hooks on", 1), ("start", 1)]
    j = log.index(("run", "EB1.0"))
    assert log[j + 1:j + 3] == [("hooks on", 0), ("start", 0)]
    assert log.count(("start", 0)) == log.count(("start", 1)) == 1


def test_replicas_defer_the_encoder_chunk_and_forward_only_is_untouched():
    log = _run(ACTIONS, replicas=object())
    assert log[log.index(("end", None)) + 1:] == [("hooks on", 0), ("start", 0)]
    assert _run(ACTIONS, forward_only=True) == [
        ("run", f"{a.kind}{a.microbatch}.{a.chunk}") for a in ACTIONS] + [("end", None)]

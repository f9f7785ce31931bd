"""--pipeline-partition search times the best-ranked candidates; one the run cannot take
(over --recompute-memory-budget, say) is skipped for the next, named in the log, and a
search where none can run is an error."""

import os
import sys
from types import SimpleNamespace

import pytest
from dist_harness import run_distributed

pytestmark = pytest.mark.processes

PLAN_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plan")


# the groups search_partition reads
_CONFIG = SimpleNamespace(
    parallel=SimpleNamespace(pipeline_model_parallel_size=2,
                             virtual_pipeline_model_parallel_size=None),
    pipeline=SimpleNamespace(pipeline_search_radius=1, pipeline_search_candidates=2,
                             pipeline_search_iters=1, pipeline_profile=None))


def _search(rank, unfit):
    """``unfit``: "first" (the best-ranked candidate cannot run) or "all"."""
    import torch.distributed as dist

    from megatron_mm.plan import PlanError
    from megatron_mm.plan.pipeline.partition_search import candidates
    from megatron_mm.training.planning.partition_trials import search_partition

    dist.init_process_group("gloo")
    sys.path.insert(0, PLAN_TESTS)
    from helpers import vlm_chain

    chain = vlm_chain(4, 4)
    ranked = [list(c.layers_per_chunk) for c in candidates(chain, 2)]
    log = []

    def build(layers):
        if unfit == "all" or layers == ranked[0]:
            raise PlanError("--recompute-memory-budget 0.1 GB: pipeline rank 1 needs more")
        return layers

    try:
        kept = search_partition(_CONFIG, chain, build, lambda: None,
                                lambda run, data: None, lambda: None, log.append)
    except PlanError as e:
        return "error", str(e)
    return ranked, kept, log[0]


def test_an_unfit_candidate_is_skipped_for_the_next():
    ranked, kept, log = run_distributed(_search, 1, "first")[0]
    assert kept in ranked[1:3]
    assert f"skipped {','.join(map(str, ranked[0]))} (--recompute-memory-budget" in log


def test_a_search_where_no_candidate_can_run_is_an_error():
    what, message = run_distributed(_search, 1, "all")[0]
    assert what == "error" and "no candidate partition can run" in message

import os

import pytest

from megatron_mm.startup import prepare_megatron_core

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# This process is an entry point: the CPU patches go in before any test imports
# Megatron-Core (a subprocess a test starts calls it itself).
prepare_megatron_core()


@pytest.fixture(scope="module")
def gloo_world():
    """A 1-rank gloo world, model parallel state TP=PP=1, RNG tracker seeded."""
    from dist_harness import one_rank_world

    with one_rank_world("gloo") as parallel_state:
        yield parallel_state

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def gloo_world():
    """A 1-rank gloo world, model parallel state TP=PP=1, RNG tracker seeded."""
    from dist_harness import one_rank_world

    with one_rank_world("gloo") as parallel_state:
        yield parallel_state

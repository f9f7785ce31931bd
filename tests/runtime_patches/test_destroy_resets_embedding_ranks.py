"""Patch ``destroy_resets_embedding_ranks``: ``destroy_model_parallel`` resets
``_EMBEDDING_GLOBAL_RANKS``."""


def test_upstream_keeps_stale_embedding_ranks(upstream):
    got = upstream.value("destroy_model_parallel")
    assert got == {"before": [0], "after": [0], "in_embedding_group_after": True}


def test_destroy_resets_and_reinitialize_sets_again(gloo_world):
    ps = gloo_world
    assert ps._EMBEDDING_GLOBAL_RANKS == [0] and ps.is_rank_in_embedding_group()
    ps.destroy_model_parallel()
    assert ps._EMBEDDING_GLOBAL_RANKS is None
    assert ps._POSITION_EMBEDDING_GLOBAL_RANKS is None
    assert not ps.is_rank_in_embedding_group()
    assert not ps.model_parallel_is_initialized()

    ps.destroy_model_parallel()  # twice is fine
    ps.initialize_model_parallel(1, 1)
    assert ps._EMBEDDING_GLOBAL_RANKS == [0] and ps.is_rank_in_embedding_group()
    assert ps.get_embedding_group().size() == 1

"""Reset the embedding-group globals in ``parallel_state.destroy_model_parallel``.

Wraps ``megatron.core.parallel_state.destroy_model_parallel`` (megatron-core 0.19.2), which
leaves ``_EMBEDDING_GLOBAL_RANKS`` set; ``initialize_model_parallel`` only sets it on member
ranks, so after re-initialising with another pipeline layout in one process
``is_rank_in_embedding_group()`` answers from the old layout. Matters to anything that
re-initialises (tests, the benchmark).
"""


def apply() -> None:
    from megatron.core import parallel_state

    destroy = parallel_state.destroy_model_parallel
    if hasattr(destroy, "__wrapped__"):
        return

    def destroy_model_parallel():
        destroy()
        for name in ("_EMBEDDING_GLOBAL_RANKS", "_POSITION_EMBEDDING_GLOBAL_RANKS"):
            if hasattr(parallel_state, name):
                setattr(parallel_state, name, None)

    destroy_model_parallel.__wrapped__ = destroy
    parallel_state.destroy_model_parallel = destroy_model_parallel

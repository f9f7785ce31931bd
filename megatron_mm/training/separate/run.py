"""``--encoder-schedule separate`` in the training run: the schedule call (``SeparateRun``)
that hands the separate program's executor its micro-batches in program order, and the
executor itself.

The program numbers an iteration's micro-batches over the LLM's replicas (``d * M + m``:
LLM replica d's micro-batch m). An LLM rank reads its own data-parallel share, as with
Megatron-Core's schedules, and places it at its replica's numbers; an encoder rank encodes
every replica's micro-batches, so it reads each replica's as that replica does (its sampler,
balanced plan or Energon loader, ``data_setup.batch_iterators(replicas=D)``), in turn
(micro-batch ``m * D + d`` is replica d's m-th), and reorders them."""

from __future__ import annotations

from functools import partial

import torch.distributed as dist
from megatron.core import parallel_state

from ...plan.schedules.problem import ScheduleProblem
from ...plan.schedules.separate import separate
from ...runtime.separate_executor import SeparateExecutor
from ...runtime.separate_placement import SeparateRanks
from ..assembly.attention import local_length
from ..planning.separate_auto import separate_program_costs
from ..assembly.separate_world import llm_lockstep_replicas, world_ranks
from ..assembly.initialize import batch_to_device


class SeparateRun:
    """Called as Megatron-Core's schedules are (``num_microbatches``: the LLM replica's
    M): reads this rank's micro-batches and runs the program's ``D * M``."""

    def __init__(self, executor: SeparateExecutor, ranks: SeparateRanks):
        self.executor, self.ranks = executor, ranks
        self.encoder = ranks.is_encoder(dist.get_rank())
        # the LLM replicas whose data this rank reads (an encoder rank: all); None: its own
        self.replicas = ranks.sizes.llm_data_parallel_size if self.encoder else None

    def __call__(self, *, data_iterator, num_microbatches: int, **kwargs):
        d, m = self.ranks.sizes.llm_data_parallel_size, num_microbatches
        # with virtual stages one iterator per model chunk, yielding the same micro-batches:
        # the first one's are read, the others kept in step
        iterators = data_iterator if isinstance(data_iterator, list) else [data_iterator]

        def read():
            return [next(it) for it in iterators][0]

        batches = [None] * (d * m)  # another replica's micro-batch: never read here
        if self.encoder:
            for k in range(d * m):
                mb, replica = divmod(k, d)
                batches[replica * m + mb] = read()
        else:
            replica = parallel_state.get_data_parallel_rank()
            for mb in range(m):
                batches[replica * m + mb] = read()
        return self.executor(data_iterator=iter(batches), num_microbatches=d * m, **kwargs)


def build_separate_run(config, plan, attention=None) -> SeparateRun:
    """The executor of ``plan.separate`` (``config``: the RunConfig; ``attention``: the
    attention settings, which give each CP rank's token count), its program made and
    checked before any step."""
    ranks = world_ranks(config)
    executor = SeparateExecutor(
        ranks, separate_program(config, plan, ranks.sizes), plan.separate.pieces,
        batch_to_device, placements=plan.separate.llm,
        local_length=(partial(local_length, attention)
                      if config.parallel.context_parallel_size > 1 else None))
    executor.program(executor.schedule(
        config.training.num_microbatches * ranks.sizes.llm_data_parallel_size), False)
    return SeparateRun(executor, ranks)


def separate_program(config, plan, sizes):
    """The run's program for ``n`` micro-batches over all LLM replicas (``sizes``: the
    placement's ``SeparateSizes``), its encoder replicas' orders chosen on the costs that
    ``--encoder-schedule auto`` simulated it with; the simulator replays the same one."""
    parallel = config.parallel
    pp, vpp = parallel.pipeline_model_parallel_size, (
        parallel.virtual_pipeline_model_parallel_size or 1)
    d, e = sizes.llm_data_parallel_size, sizes.encoder_data_parallel_size
    trainable = plan.separate_trainable
    costs = separate_program_costs(config, plan.chain, plan.partition,
                                   sizes.encoder_tensor_model_parallel_size, e).costs
    return lambda n: separate(ScheduleProblem(
        pp, n // d, virtual_pipeline_model_parallel_size=vpp, llm_data_parallel_size=d,
        encoder_data_parallel_size=e, encoder_trainable=any(trainable),
        encoders=len(plan.separate.pieces),
        frozen_encoders=[i for i, t in enumerate(trainable) if not t],
        encoder_data_parallel_sizes=sizes.encoder_data_parallel_sizes,
        costs=costs, lockstep_replicas=llm_lockstep_replicas(config)))

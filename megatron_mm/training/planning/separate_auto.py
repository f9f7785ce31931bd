"""``--encoder-schedule auto``'s separate alternatives: the same world split into encoder
ranks and the LLM's, each simulated as the separate program runs it.

For each encoder TP (the flag's, or each divisor of the LLM's TP) and encoder DP whose
E = encoder TP x encoder DP ranks leave the LLM a multiple of TP x CP, the LLM keeps its
TP and CP and takes PP = the flags' where the rest allows it, else each divisor of
(world - E) / (TP x CP) below it (a 2-rank world at PP 2 still has "1 encoder rank + the
LLM at PP 1"). An alternative is offered only when the run can execute it: its flags
(``--encoder-schedule separate`` with these sizes, on the same world) pass the flags' own
validation (``RunConfig.validated``: ``separate_args``' refusals, the global batch
dividing into the LLM's data-parallel size) and the LLM's layers split over its PP. The
run of the chosen one is that validation's RunConfig (``separate_run_config``), so what
was simulated is what runs.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from ...config import ConfigError
from ...plan import PlanError, partition
from ...plan.pipeline.partition import parse_partition_flag
from ...plan.schedules.encoder_pipeline import split_chain
from ...plan.schedules.problem import ScheduleProblem
from ...plan.schedules.separate import separate
from ...plan.schedules.separate_costs import (SeparateCosts, separate_costs,
                                               separate_iteration_s)
from ..config.run_config import RunConfig
from ..assembly.separate_world import llm_lockstep_replicas
from .time_inputs import hardware, time_inputs


def separate_run_config(config, encoder_tp: int, encoder_dp: int, pp: int) -> RunConfig:
    """``config`` (the RunConfig) as ``--encoder-schedule separate`` with these sizes on
    the same world, validated as the flags are (a ConfigError names what refuses it)."""
    trial = dataclasses.replace(
        config, encoder_schedule=dataclasses.replace(
            config.encoder_schedule, encoder_schedule="separate",
            encoder_tensor_model_parallel_size=encoder_tp,
            encoder_data_parallel_size=encoder_dp),
        parallel=dataclasses.replace(config.parallel, pipeline_model_parallel_size=pp))
    return trial.validated(config.parallel.world_size)


def separate_partition(config, chain, policy=None):
    """The LLM's partition over its own chain (``config``: the separate run's)."""
    parallel = config.parallel
    policy = (policy if policy is not None
              else parse_partition_flag(config.pipeline.pipeline_partition))
    return partition(split_chain(chain)[1], parallel.pipeline_model_parallel_size,
                     parallel.virtual_pipeline_model_parallel_size or 1, policy,
                     num_microbatches=config.training.num_microbatches)


def encoder_trainable(chain) -> List[bool]:
    """Per encoder (chain order): whether it runs a backward (a trainable layer)."""
    return [any(l.trainable for l in layers if l.kind.endswith(("_layer", "_embed")))
            for _, layers in split_chain(chain)[0]]


def llm_pipeline_sizes(config, llm_ranks: int) -> List[int]:
    """The LLM's PP on ``llm_ranks``: the flags' where they divide, else each divisor of
    them / (TP x CP) below it, largest first."""
    parallel = config.parallel
    pp = parallel.pipeline_model_parallel_size
    model = parallel.tensor_model_parallel_size * parallel.context_parallel_size
    if llm_ranks % model:
        return []
    if llm_ranks % (model * pp) == 0:
        return [pp]
    return [d for d in range(pp - 1, 0, -1) if (llm_ranks // model) % d == 0]


def separate_program_costs(run: RunConfig, chain, part, encoder_tp: int,
                           encoder_dp: int) -> SeparateCosts:
    """What each action of the separate run ``run`` costs (``part``: the LLM's partition;
    the encoders at ``encoder_tp`` x ``encoder_dp``): ``auto`` simulates the program on
    them, and the run orders its encoder replicas' actions by them
    (``separate_run.separate_program``), so what was simulated is what runs."""
    return separate_costs(chain, part, hardware(run.pipeline),
                          encoder_tensor_model_parallel_size=encoder_tp,
                          encoder_data_parallel_size=encoder_dp,
                          context_parallel_size=run.parallel.context_parallel_size,
                          **time_inputs(run))


def separate_iteration(run: RunConfig, chain) -> float:
    """The simulated iteration of the separate run ``run`` on ``chain``'s costs."""
    parallel, schedule = run.parallel, run.encoder_schedule
    costs = separate_program_costs(run, chain, separate_partition(run, chain),
                                   schedule.encoder_tensor_model_parallel_size,
                                   schedule.encoder_data_parallel_size)
    trainable = encoder_trainable(chain)
    program = separate(ScheduleProblem(
        parallel.pipeline_model_parallel_size, run.training.num_microbatches,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size or 1,
        llm_data_parallel_size=parallel.data_parallel_size,
        encoder_data_parallel_size=schedule.encoder_data_parallel_size,
        encoder_trainable=any(trainable), encoders=len(trainable),
        frozen_encoders=[i for i, t in enumerate(trainable) if not t],
        costs=costs.costs, lockstep_replicas=llm_lockstep_replicas(run)))
    return separate_iteration_s(program, costs)


def separate_alternatives(config, chain, make) -> list:
    """``make(encoder TP, encoder DP, LLM PP, LLM DP, iteration)`` of every separate
    alternative the run can execute (module docstring)."""
    world, tp = config.parallel.world_size, config.parallel.tensor_model_parallel_size
    given: Optional[int] = config.encoder_schedule.encoder_tensor_model_parallel_size
    etps = [given] if given else [d for d in range(tp, 0, -1) if tp % d == 0]
    out = []
    for etp in etps:
        for edp in range(1, (world - 1) // etp + 1):  # the LLM keeps a rank
            for pp in llm_pipeline_sizes(config, world - etp * edp):
                try:
                    run = separate_run_config(config, etp, edp, pp)
                    seconds = separate_iteration(run, chain)
                except (ConfigError, PlanError):  # a size the run refuses, or the
                    continue                      # LLM's layers do not split
                out.append(make(etp, edp, pp, run.parallel.data_parallel_size, seconds))
    return out


def with_separate(config, run: RunConfig):
    """``config`` with ``run``'s groups that the separate alternative sets."""
    return dataclasses.replace(config, parallel=run.parallel, training=run.training,
                               encoder_schedule=run.encoder_schedule)

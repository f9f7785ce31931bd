"""``--encoder-schedule auto``: the planner picks the encoder schedule of a training run.

Every alternative is built and simulated on the training chain's per-action costs (the
cost model, or the measured per-layer times of ``--pipeline-profile``), the very costs
the ``bubble`` schedule is generated on and the simulator replays, so one cost model
serves the choice, the run's schedule and its simulation:

- ``megatron``: Megatron-Core's schedule, the encoders inside the chunks
  ``--pipeline-partition`` gives them;
- ``coarse`` and ``bubble``: every encoder as its own pipeline over each encoder PP that
  divides PP, at 1, 2 or 4 pieces per stage (where the encoder has the layers).

The fastest wins (ties: the earlier in that order, the simpler schedule); the run then
takes its ``--encoder-schedule``, ``--encoder-pipeline-model-parallel-size`` and
``--encoder-pieces``. The encoder TP stays as given: the training chain's costs do not
model TP traffic, so they cannot tell encoder TPs apart. Encoder-pipeline alternatives
are left out where the run's other flags do not combine with them (``--pipeline-partition
search``, ``--recompute-memory-budget``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import List, Optional

from ..plan import ModelSpec, PlanError, Workload, build_chain, partition
from ..plan.bubble import bubble
from ..plan.encoder_pipeline import megatron_costs, plan_encoder_pipeline, schedule_costs
from ..plan.generate import coarse, megatron
from ..plan.hardware import Hardware
from ..plan.profile import MEASURED, LayerProfile, apply_profile
from ..plan.record import Record
from ..plan.simulate import simulate


@dataclass
class Alternative(Record):
    schedule: str  # megatron | coarse | bubble
    encoder_pipeline_model_parallel_size: Optional[int]
    encoder_pieces: int
    iteration_s: float

    def describe(self) -> str:
        if self.schedule == "megatron":
            return "megatron"
        return (f"{self.schedule}, encoder PP {self.encoder_pipeline_model_parallel_size}, "
                f"{self.encoder_pieces} piece(s) per stage")


@dataclass
class AutoChoice(Record):
    chosen: Alternative
    alternatives: List[Alternative] = field(default_factory=list)  # as simulated
    measured: bool = False  # seconds of --pipeline-profile, else cost-model units

    def lines(self) -> List[str]:
        unit = " s (measured profile)" if self.measured else " s (cost model)"
        out = [f"> --encoder-schedule auto chose {self.chosen.describe()}: simulated "
               f"iteration {self.chosen.iteration_s:.4g}{unit}; the alternatives:"]
        out += [f"   {a.describe()}: {a.iteration_s:.4g}"
                for a in sorted(self.alternatives, key=lambda a: a.iteration_s)]
        return out


def _chain(args):
    """The training chain from the model config (the tokenizer's vocabulary is not known
    yet: a stand-in only shifts the output layer's cost; a profile measures it)."""
    config = copy.deepcopy(args.model_config)
    config.language.vocab_size = config.language.vocab_size or 1
    chain = build_chain(ModelSpec.from_config(config),
                        Workload(seq_length=args.seq_length,
                                 micro_batch_size=args.micro_batch_size,
                                 tensor_model_parallel_size=args.tensor_model_parallel_size))
    if getattr(args, "pipeline_profile", None):
        chain = apply_profile(chain, LayerProfile.load(args.pipeline_profile))
    return chain


def choose_encoder_schedule(args, chain=None) -> AutoChoice:
    """Simulate the alternatives for this run and return the fastest (module docstring)."""
    chain = chain if chain is not None else _chain(args)
    hw = MEASURED if getattr(args, "pipeline_profile", None) else Hardware()
    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size or 1
    m, tp = args.num_microbatches, args.tensor_model_parallel_size
    etp = args.encoder_tensor_model_parallel_size or tp
    if etp < 1 or tp % etp:
        raise PlanError(f"--encoder-tensor-model-parallel-size ({etp}) must divide "
                        f"--tensor-model-parallel-size ({tp})")
    alternatives: List[Alternative] = []
    if etp == tp:  # Megatron-Core's schedules have no encoder TP of their own
        part = partition(chain, pp, vpp, args.pipeline_partition, num_microbatches=m,
                         search_radius=getattr(args, "pipeline_search_radius", 1))
        sim = simulate(megatron(pp, vpp, m), megatron_costs(chain, part, hw), False)
        alternatives.append(Alternative("megatron", None, 1, sim.iteration_s))
    separate = (args.pipeline_partition != "search"
                and getattr(args, "recompute_memory_budget", None) is None)
    for stages in [d for d in range(1, pp + 1) if pp % d == 0] if separate else []:
        for pieces in (1, 2, 4):
            try:
                plan = plan_encoder_pipeline(chain, pp, vpp, args.pipeline_partition, stages,
                                             pieces, m, hw)
            except PlanError:  # an encoder too short for these pieces
                continue
            costs = schedule_costs(chain, plan.llm_partition, plan.pieces, hw)
            settings = dict(encoders=len(plan.pieces), frozen_encoders=plan.frozen_encoders,
                            encoder_replicas=tp // etp, grad_sync=True)
            for kind in ("coarse", "bubble"):
                s = (coarse(pp, vpp, m, plan.encoder_trainable, stages, pieces, **settings)
                     if kind == "coarse" else
                     bubble(pp, vpp, m, plan.encoder_trainable, costs, stages, pieces,
                            extra_warmup="auto", **settings))
                alternatives.append(Alternative(kind, stages, pieces,
                                                simulate(s, costs, False).iteration_s))
    if not alternatives:
        raise PlanError("--encoder-schedule auto has nothing to choose from: "
                        "--encoder-tensor-model-parallel-size below --tensor-model-parallel-"
                        "size needs the encoder as its own pipeline, which "
                        "--pipeline-partition search / --recompute-memory-budget exclude")
    best = min(alternatives, key=lambda a: a.iteration_s)  # first of equals: simpler
    return AutoChoice(chosen=best, alternatives=alternatives, measured=hw is MEASURED)


def apply_encoder_schedule_auto(args) -> None:
    """Choose, then set the run's flags to the choice; the report goes to
    ``args.encoder_schedule_auto`` (printed with the pipeline plan, on rank 0)."""
    choice = choose_encoder_schedule(args)
    c = choice.chosen
    args.encoder_schedule = c.schedule
    if c.schedule == "megatron":  # no encoder pipeline of its own
        args.encoder_pipeline_model_parallel_size = None
        args.encoder_tensor_model_parallel_size = None
    else:
        args.encoder_pipeline_model_parallel_size = c.encoder_pipeline_model_parallel_size
        args.encoder_pieces = c.encoder_pieces
    args.encoder_schedule_auto = choice

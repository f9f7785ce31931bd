"""The run's encoder schedule, and ``--encoder-schedule auto``: the planner picks it.

``plan_pipeline`` settles it once, on the training chain with the tokenizer's real
vocabulary, into the ``TrainingPlan`` (``EncoderScheduleChoice``): the flags' schedule,
encoder PP, encoder TP and pieces, or with ``auto`` the fastest simulated alternative:

- ``megatron``: Megatron-Core's schedule, the encoders inside the chunks
  ``--pipeline-partition`` gives them, at the LLM's TP;
- ``coarse`` and ``bubble``: every encoder as its own pipeline over each encoder PP that
  divides PP, at 1, 2 or 4 pieces per stage (where the encoder has the layers), not
  interleaved and (encoder PP of at least 2) interleaved over 2 rounds
  (``--encoder-virtual-pipeline-model-parallel-size``: the flag's only, when given), at each
  encoder TP dividing TP that the run's other flags allow (encoder replicas = TP /
  encoder TP; ``--encoder-tensor-model-parallel-size`` given: that one only), each planned
  as the run would plan it with those flags (``encoder_schedule.encoder_pipeline_plan``:
  for bubble, the encoder's placement and stage boundaries searched by simulation);
- ``separate``: the encoders on ranks of their own, each encoder rank count the world
  allows and the LLM's PP on the ranks left, where the run's flags allow the placement
  (``separate_auto.py``), simulated as the separate program on the same time model.

Every alternative is simulated on the per-action costs of ``encoder_pipeline``'s
``schedule_costs`` / ``megatron_costs``, timed by ``plan/unit_costs.TimeModel`` (the
Optimus planner's time model): compute from the cost model, or the measured per-layer
times of ``--pipeline-profile``, plus the TP all-reduces, the encoder replicas' broadcast
and gradient sum modelled on ``plan/hardware.Interconnect``'s links (a profile's layer
times carry no TP traffic: its ``tp_links``, or the defaults). The same costs generate
the run's ``bubble`` schedule and the simulator replays them. The fastest wins; ties go
to the earlier in that order (the simpler schedule, the larger encoder TP; separate
last). Auto's separate pick changes the run's parallel sizes: ``applied`` gives the run
the RunConfig of those sizes (made before any process group). Encoder-pipeline
alternatives are left out where the run's other flags do not combine with them
(``--pipeline-partition search``, ``--recompute-memory-budget``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional

from ...config import ConfigError
from ...plan import PlanError, partition
from ...plan.schedules.collectives import add_expert_all_to_alls
from ...plan.schedules.encoder_pipeline import expert_chunks, megatron_costs
from ...plan.schedules.generate import megatron
from ...plan.pipeline.profile import MEASURED
from ...plan.record import Record
from ...plan.schedules.simulate import simulate
from ..config.fp8_args import validate_fp8_args
from ..config.sequence_parallel import validate_sequence_parallel
from .encoder_schedule import encoder_pipeline_plan, make_schedule, plan_costs
from .separate_auto import separate_alternatives, separate_run_config, with_separate
from .time_inputs import hardware, time_basis, time_inputs


@dataclass
class Alternative(Record):
    schedule: str  # megatron | coarse | bubble | separate
    encoder_pipeline_model_parallel_size: Optional[int]
    encoder_pieces: int
    iteration_s: float
    encoder_tensor_model_parallel_size: Optional[int] = None  # None: the LLM's (megatron)
    tensor_model_parallel_size: int = 1
    # separate: the encoder replicas, and the LLM's PP and DP on the ranks they leave
    encoder_data_parallel_size: Optional[int] = None
    pipeline_model_parallel_size: Optional[int] = None
    data_parallel_size: Optional[int] = None
    encoder_virtual_pipeline_model_parallel_size: int = 1  # coarse | bubble: interleaving

    def describe(self) -> str:
        if self.schedule == "megatron":
            return "megatron"
        if self.schedule == "separate":
            etp, edp = self.encoder_tensor_model_parallel_size, self.encoder_data_parallel_size
            ranks = etp * edp
            return (f"separate, {ranks} encoder rank{'s' if ranks > 1 else ''} (TP {etp} x "
                    f"DP {edp}), LLM PP {self.pipeline_model_parallel_size} DP "
                    f"{self.data_parallel_size}")
        tp = (f" TP {self.encoder_tensor_model_parallel_size}"
              if self.tensor_model_parallel_size > 1 else "")
        v = self.encoder_virtual_pipeline_model_parallel_size
        return (f"{self.schedule}, encoder PP {self.encoder_pipeline_model_parallel_size}"
                f"{tp}{f' VPP {v}' if v > 1 else ''}, {self.encoder_pieces} piece(s) per "
                "stage")


@dataclass
class AutoChoice(Record):
    chosen: Alternative
    alternatives: List[Alternative] = field(default_factory=list)  # as simulated
    measured: bool = False  # seconds of --pipeline-profile, else cost-model units
    basis: str = ""  # what the times rest on, in words (time_inputs.time_basis)

    def tied(self, a: Alternative) -> bool:
        """Whether ``a`` simulates as fast as the choice (to float precision)."""
        best = self.chosen.iteration_s
        return abs(a.iteration_s - best) <= 1e-9 * max(abs(best), 1e-300)

    def lines(self) -> List[str]:
        unit = " s (measured profile)" if self.measured else " s (cost model)"
        ties = sum(self.tied(a) for a in self.alternatives) - 1
        tie = (f", tied with {ties} other{'s' if ties > 1 else ''} (a tie goes to the "
               f"simpler schedule)" if ties > 0 else "")
        out = [f"> --encoder-schedule auto chose {self.chosen.describe()}: simulated "
               f"iteration {self.chosen.iteration_s:.4g}{unit}{tie}"]
        if self.basis:
            out.append(f"   times from {self.basis}")
        out.append("   the alternatives, fastest first (= ties with the choice):")
        out += [f"   {'=' if self.tied(a) else ' '} {a.describe()}: {a.iteration_s:.4g}"
                for a in sorted(self.alternatives, key=lambda a: a.iteration_s)]
        return out


@dataclass
class EncoderScheduleChoice(Record):
    """The run's encoder schedule (the one source the run's flags of it derive from)."""

    encoder_schedule: str  # megatron | coarse | bubble
    encoder_pipeline_model_parallel_size: Optional[int] = None  # None: megatron
    encoder_tensor_model_parallel_size: Optional[int] = None  # None: megatron
    encoder_pieces: int = 1
    auto: Optional[AutoChoice] = None  # --encoder-schedule auto: what it simulated
    # auto chose separate: its encoder replicas and the LLM's PP (None: the flags')
    encoder_data_parallel_size: Optional[int] = None
    pipeline_model_parallel_size: Optional[int] = None
    encoder_virtual_pipeline_model_parallel_size: Optional[int] = None

    @classmethod
    def from_flags(cls, schedule) -> "EncoderScheduleChoice":
        """The flags' schedule (``schedule``: the encoder-schedule group)."""
        return cls(schedule.encoder_schedule, schedule.encoder_pipeline_model_parallel_size,
                   schedule.encoder_tensor_model_parallel_size, schedule.encoder_pieces,
                   encoder_virtual_pipeline_model_parallel_size=(
                       schedule.encoder_virtual_pipeline_model_parallel_size))

    def applied(self, config):
        """``config`` (the RunConfig) with this schedule as its encoder-schedule group
        (auto's separate: with the placement's parallel sizes and micro-batches too)."""
        if self.pipeline_model_parallel_size is not None:
            if config.encoder_schedule.encoder_schedule == "separate":
                return config  # the run's: applied already (its world is the LLM's)
            return with_separate(config, separate_run_config(
                config, self.encoder_tensor_model_parallel_size,
                self.encoder_data_parallel_size, self.pipeline_model_parallel_size))
        return with_schedule(config, self.encoder_schedule,
                             self.encoder_pipeline_model_parallel_size,
                             self.encoder_tensor_model_parallel_size, self.encoder_pieces,
                             self.encoder_virtual_pipeline_model_parallel_size)

    def lines(self) -> List[str]:
        return self.auto.lines() if self.auto is not None else []


def with_schedule(config, encoder_schedule: str, stages: Optional[int], etp: Optional[int],
                  pieces: int, virtual: Optional[int] = None):
    """``config`` with these encoder-schedule flags (the flags given stay as typed)."""
    return dataclasses.replace(config, encoder_schedule=dataclasses.replace(
        config.encoder_schedule, encoder_schedule=encoder_schedule,
        encoder_pipeline_model_parallel_size=stages,
        encoder_tensor_model_parallel_size=etp, encoder_pieces=pieces,
        encoder_virtual_pipeline_model_parallel_size=virtual))


def encoder_tp_options(config) -> List[int]:
    """The encoder TPs auto may pick, largest first: the flag's, or each divisor of TP
    the run's other flags allow (checked as if given as
    ``--encoder-tensor-model-parallel-size``)."""
    tp = config.parallel.tensor_model_parallel_size
    if config.encoder_schedule.encoder_tensor_model_parallel_size:
        return [config.encoder_schedule.encoder_tensor_model_parallel_size]
    options = []
    for etp in [d for d in range(tp, 0, -1) if tp % d == 0]:
        trial = dataclasses.replace(config, encoder_schedule=dataclasses.replace(
            config.encoder_schedule, encoder_tensor_model_parallel_size=etp))
        try:
            if etp < tp and config.parallel.context_parallel_size > 1:
                continue  # the replicas' groups assume one CP rank (arguments.py)
            validate_sequence_parallel(trial)
            config.model_config.validate_parallel(tp, etp)
            validate_fp8_args(trial)
        except ConfigError:
            continue
        options.append(etp)
    return options


def choose_encoder_schedule(config, chain) -> AutoChoice:
    """Simulate the alternatives for this run on ``chain`` (the training chain, with the
    real vocabulary) and return the fastest (module docstring)."""
    hw = hardware(config.pipeline)
    pp = config.parallel.pipeline_model_parallel_size
    vpp = config.parallel.virtual_pipeline_model_parallel_size or 1
    m, tp = config.training.num_microbatches, config.parallel.tensor_model_parallel_size
    timing = time_inputs(config)
    etps = encoder_tp_options(config)
    alternatives: List[Alternative] = []
    if tp in etps:  # Megatron-Core's schedules have no encoder TP of their own
        part = partition(chain, pp, vpp, config.pipeline.pipeline_partition,
                         num_microbatches=m, hardware=hw,
                         search_radius=config.pipeline.pipeline_search_radius)
        moe = expert_chunks([chain[s:e] for s, e in part.chunk_bounds()])
        sim = simulate(add_expert_all_to_alls(megatron(pp, vpp, m), moe),
                       megatron_costs(chain, part, hw, **timing), False)
        alternatives.append(Alternative("megatron", None, 1, sim.iteration_s,
                                        tensor_model_parallel_size=tp))
    separate = (config.pipeline.pipeline_partition != "search"
                and config.recompute.recompute_memory_budget is None)
    given = config.encoder_schedule.encoder_virtual_pipeline_model_parallel_size
    for etp in etps if separate else []:
        for stages in [d for d in range(1, pp + 1) if pp % d == 0]:
            for virtual in [given] if given else ([1, 2] if stages > 1 else [1]):
                for pieces in (1, 2, 4):
                    for kind in ("coarse", "bubble"):
                        # the run's own planning with these flags (placement and stage
                        # boundaries searched for bubble), so the choice is what runs
                        flags = with_schedule(config, kind, stages, etp, pieces, virtual)
                        try:
                            plan = encoder_pipeline_plan(flags, chain)
                        except PlanError:  # an encoder too short for these pieces
                            break
                        sim = simulate(make_schedule(flags, plan, m, chain),
                                       plan_costs(flags, plan, chain), False)
                        alternatives.append(Alternative(
                            kind, stages, pieces, sim.iteration_s, etp, tp,
                            encoder_virtual_pipeline_model_parallel_size=virtual))
    alternatives += separate_alternatives(config, chain, lambda etp, edp, llm_pp, dp, t: (
        Alternative("separate", None, 1, t, etp, tp, edp, llm_pp, dp)))
    if not alternatives:
        raise PlanError("--encoder-schedule auto has nothing to choose from: "
                        "--encoder-tensor-model-parallel-size below --tensor-model-parallel-"
                        "size needs the encoder as its own pipeline, which "
                        "--pipeline-partition search / --recompute-memory-budget exclude")
    best = min(alternatives, key=lambda a: a.iteration_s)  # first of equals: simpler
    return AutoChoice(chosen=best, alternatives=alternatives, measured=hw is MEASURED,
                      basis=time_basis(config.pipeline))


def encoder_schedule_choice(config, chain) -> EncoderScheduleChoice:
    """The run's encoder schedule: the flags', or (``auto``) the planner's pick."""
    if config.encoder_schedule.encoder_schedule != "auto":
        return EncoderScheduleChoice.from_flags(config.encoder_schedule)
    auto = choose_encoder_schedule(config, chain)
    c = auto.chosen
    if c.schedule == "megatron":  # no encoder pipeline of its own
        return EncoderScheduleChoice("megatron", auto=auto)
    if c.schedule == "separate":
        return EncoderScheduleChoice("separate", None, c.encoder_tensor_model_parallel_size,
                                     auto=auto,
                                     encoder_data_parallel_size=c.encoder_data_parallel_size,
                                     pipeline_model_parallel_size=c.pipeline_model_parallel_size)
    return EncoderScheduleChoice(c.schedule, c.encoder_pipeline_model_parallel_size,
                                 c.encoder_tensor_model_parallel_size, c.encoder_pieces, auto,
                                 encoder_virtual_pipeline_model_parallel_size=(
                                     c.encoder_virtual_pipeline_model_parallel_size))

"""One schedule problem: what every generator (``generate.coarse``, ``bubble.bubble``,
``dataflow.dataflow``, ``separate.separate``) is asked to order, as one typed record.

A ``ScheduleProblem`` says what the iteration is (the LLM's pipeline: PP, VPP, its
micro-batches), what the encoders are (each its own pipeline with its ``EncoderLayout``, or
``encoders`` alike ones; which are frozen), what the collectives are (encoder replicas per
TP group, whether the data-parallel reductions' start points are actions) and what each
action costs (``costs``, for the generators that place work by time). How a generator
searches (``bubble``'s ``extra_warmup`` and ``tp_bubbles``, ``dataflow``'s memory bounds) are
its own keyword arguments, not part of the problem.

The separate placement (encoder ranks of their own, ``separate.separate``) reads
``num_microbatches`` as each LLM replica's (Megatron-Core's ``num_microbatches``, per
data-parallel rank) and the replicas' fields below; the colocated generators refuse a
problem with more than one LLM replica (each pipeline runs its own copy of the schedule).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import List, Optional, Tuple

from ..errors import PlanError
from ..record import Record
from .actions import Schedule
from .simulate import ActionCosts


@dataclass
class EncoderLayout(Record):
    """One encoder's own pipeline layout (``encoder_placement``): its stages, the pieces
    each stage is cut into, and whether it is placed from the last rank."""

    encoder_pipeline_model_parallel_size: int
    pieces: int = 1
    reverse: bool = False
    virtual: int = 1  # --encoder-virtual-pipeline-model-parallel-size

    def ranks(self, pp: int) -> List[int]:
        return encoder_placement(pp, self.encoder_pipeline_model_parallel_size, self.pieces,
                                 self.reverse, self.virtual)[1]


def encoder_placement(pp: int, encoder_stages: Optional[int] = None, pieces: int = 1,
                      reverse: bool = False, virtual: int = 1) -> Tuple[int, List[int]]:
    """(encoder stages, the rank of each encoder piece): stage s on rank s * (PP / stages)
    (``reverse``: counted from the last rank, so the encoder ends on the rank the LLM
    starts on), cut into ``pieces`` consecutive pieces there; encoder PP must divide LLM
    PP. ``virtual`` > 1 (``--encoder-virtual-pipeline-model-parallel-size``) interleaves
    the encoder as Megatron-Core interleaves the LLM: its layers run ``virtual`` times
    over the stages, each rank holding ``virtual`` ranges of them, so the first
    micro-batch's first piece (which every other rank waits for) and the last one's
    backward (which ends the iteration) are ``virtual`` times shorter."""
    stages = encoder_stages or pp
    if stages < 1 or pp % stages:
        raise PlanError(f"--encoder-pipeline-model-parallel-size ({stages}) must divide "
                        f"--pipeline-model-parallel-size ({pp})")
    if pieces < 1:
        raise PlanError(f"--encoder-pieces must be at least 1 (got {pieces})")
    if virtual < 1 or (virtual > 1 and stages < 2):
        raise PlanError(f"--encoder-virtual-pipeline-model-parallel-size ({virtual}) needs "
                        "an encoder pipeline of at least 2 stages "
                        f"(--encoder-pipeline-model-parallel-size is {stages})"
                        if virtual > 1 else
                        f"--encoder-virtual-pipeline-model-parallel-size must be at least 1 "
                        f"(got {virtual})")
    ranks = [((p // pieces) % stages) * (pp // stages) for p in range(virtual * stages * pieces)]
    return stages, [pp - 1 - r for r in ranks] if reverse else ranks


@dataclass
class ScheduleProblem(Record):
    """What a schedule generator orders (module docstring). Only the LLM's pipeline and
    micro-batch count are positional; everything else is named."""

    pipeline_model_parallel_size: int
    num_microbatches: int
    _: KW_ONLY
    virtual_pipeline_model_parallel_size: int = 1
    # Whether any encoder runs backwards (EB); ``frozen_encoders`` (indexes) have none
    # while another trains.
    encoder_trainable: bool = True
    frozen_encoders: List[int] = field(default_factory=list)
    # Seconds per action (``bubble`` and ``dataflow`` need them; ``separate`` orders its
    # encoder replicas by them, unit costs without; ``coarse`` ignores them).
    costs: Optional[ActionCosts] = None
    # The encoders' pipelines: ``layouts``, one per encoder; or (empty) ``encoders`` alike
    # ones of ``encoder_stages`` stages (None: PP) of ``pieces`` pieces each, ``reverse``:
    # placed from the last rank (``encoder_placement``).
    layouts: List[EncoderLayout] = field(default_factory=list)
    encoders: int = 1
    encoder_stages: Optional[int] = None
    pieces: int = 1
    reverse: bool = False
    # The collectives (``collectives.add_collectives``): encoder replicas per LLM TP group
    # (TP / encoder TP), the data-parallel reductions' start points as actions
    # (GRAD_SYNC), the encoder pieces reducing on their own (ENCODER_GRAD_SYNC).
    encoder_replicas: int = 1
    grad_sync: bool = False
    encoder_grad_sync: bool = False
    # The separate placement only (``separate.separate``): LLM replicas, encoder replicas
    # (all; ``encoder_data_parallel_sizes``: each encoder's own, summing to it), how far
    # an encoder replica runs ahead (None: PP + 1), and the LLM replicas meeting in
    # collectives inside their actions (``separate.Members``).
    llm_data_parallel_size: int = 1
    encoder_data_parallel_size: int = 1
    encoder_data_parallel_sizes: List[int] = field(default_factory=list)
    lookahead: Optional[int] = None
    lockstep_replicas: int = 1

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size

    def encoder_layouts(self) -> List[EncoderLayout]:
        """Each encoder's layout (``layouts``, or ``encoders`` alike ones)."""
        if self.layouts:
            return list(self.layouts)
        if self.encoders < 1:
            raise PlanError(f"a schedule with separate encoders needs at least one (got "
                            f"{self.encoders})")
        stages = encoder_placement(self.pp, self.encoder_stages)[0]
        return [EncoderLayout(stages, self.pieces, self.reverse)] * self.encoders

    def costs_for(self, generator: str) -> ActionCosts:
        """``costs``, which ``generator`` needs: a ``PlanError`` without them."""
        if self.costs is None:
            raise PlanError(f"the {generator} schedule places work by time: its "
                            "ScheduleProblem needs per-action costs (costs=ActionCosts(...))")
        return self.costs

    def colocated(self, generator: str) -> None:
        """Refuse the separate placement's fields in a colocated generator's problem."""
        if (self.llm_data_parallel_size, self.encoder_data_parallel_size,
                self.lockstep_replicas) != (1, 1, 1) or self.encoder_data_parallel_sizes \
                or self.lookahead is not None:
            raise PlanError(f"the {generator} schedule is one LLM pipeline's (the encoders on "
                            "its ranks); llm_data_parallel_size, encoder_data_parallel_size"
                            "(s), lookahead and lockstep_replicas are the separate "
                            "placement's (encoder_schedule separate)")

    def empty_schedule(self, name: str) -> Schedule:
        """An empty schedule (no actions yet, no collectives: ``add_collectives`` places
        them once the compute is ordered) whose encoders each run as their own pipeline,
        their pieces numbered one encoder after the other; ``frozen_encoders`` have no
        backward."""
        self.colocated(name)
        per_encoder = [layout.ranks(self.pp) for layout in self.encoder_layouts()]
        ranks = [r for mine in per_encoder for r in mine]
        return Schedule(name=name, pipeline_model_parallel_size=self.pp,
                        virtual_pipeline_model_parallel_size=self.vpp,
                        num_microbatches=self.num_microbatches, encoder_stages=len(ranks),
                        encoder_trainable=self.encoder_trainable, encoder_ranks=ranks,
                        encoder_pieces=([len(m) for m in per_encoder]
                                        if len(per_encoder) > 1 else []),
                        frozen_encoders=sorted(self.frozen_encoders))

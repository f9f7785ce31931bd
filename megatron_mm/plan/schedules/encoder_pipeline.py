"""The encoder as its own pipeline (Optimus): its pieces, where they run, what they cost.

With ``--encoder-schedule coarse|bubble`` the LLM is partitioned over the pipeline's model
chunks on its own chain (word embedding, decoder layers, head) and the encoder's
transformer layers are cut into consecutive pieces, piece p on rank
``encoder_ranks[p]`` (``generate.encoder_placement``). Each rank's pieces live in its first
model chunk (virtual stage 0). The encoder's patch embedding runs with piece 0; its output
norm and the projector run with LLM chunk 0, which merges the features into the text, so a
frozen encoder with a trainable projector needs no encoder backward. A model with several
encoders (vision and audio) cuts each the same way, over the same ranks: its pieces are
numbered after the previous encoder's (in chain order), each encoder balanced against the
LLM and the encoders placed before it.

The same records drive the runtime (which modules a chunk builds, which layers an ``EF``
action runs) and the simulator (``schedule_costs``: per-action seconds summed from the
training chain, i.e. the cost model or a measured per-layer profile of this very model;
``action_costs.py`` models cluster-scale runs from model sizes, with TP and DP traffic).

With ``--encoder-tensor-model-parallel-size`` e smaller than the LLM's TP t, each LLM TP
group holds r = t / e encoder replicas (replica j: the group's ranks ``j*e .. j*e+e-1``).
The schedule stays one action list per pipeline rank; replica j runs the ``EF`` / ``EB``
actions of the micro-batches it owns (``encoder_replica_of``) and skips the others, so the
replicas' encoder work runs concurrently (the simulator charges each rank every encoder
action, as for r = 1).
"""

from __future__ import annotations

import math
from itertools import accumulate, combinations, groupby
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..costs.hardware import Hardware, Interconnect
from ..costs.unit_costs import TimeModel, UnitSeconds, replica_share
from ..errors import PlanError
from ..pipeline.layers import LLM, TRANSFORMER_KINDS, Layer
from ..pipeline.minmax import minmax_split, prefix_sums
from ..pipeline.partition import StagePartition, partition
from ..pipeline.placement import ChunkPlacement, EncoderPlacement, chunk_placements
from ..record import Record
from .generate import encoder_placement
from .simulate import ActionCosts


@dataclass
class EncoderPieces(Record):
    """Encoder ``name``'s layers ``[start, end)`` per piece and the rank running each."""

    name: str
    layers: List[List[int]] = field(default_factory=list)
    ranks: List[int] = field(default_factory=list)

    def of_rank(self, rank: int) -> List[int]:
        return [p for p, r in enumerate(self.ranks) if r == rank]


def split_chain(chain: Sequence[Layer]) -> Tuple[List[Tuple[str, List[Layer]]], List[Layer]]:
    """([(encoder name, its layers)] in chain order, the LLM's layers)."""
    encoders: Dict[str, List[Layer]] = {}
    for l in chain:
        if l.branch != LLM:
            encoders.setdefault(l.branch, []).append(l)
    if not encoders:
        raise PlanError("--encoder-schedule coarse|bubble runs the encoders as their own "
                        "pipelines; this model has none (use --encoder-schedule megatron)")
    return list(encoders.items()), [l for l in chain if l.branch == LLM]


def encoder_pieces(chain: Sequence[Layer], encoder_ranks: Sequence[int],
                   rank_load: Optional[Sequence[float]] = None,
                   hardware: Optional[Hardware] = None,
                   name: Optional[str] = None, shift: Sequence[int] = (),
                   segments: Sequence[int] = ()) -> EncoderPieces:
    """Cut the encoder's transformer layers into ``len(encoder_ranks)`` pieces, each of at
    least one layer. A segment is a run of consecutive pieces on one rank (a stage; an
    interleaved encoder, ``encoder_placement(virtual=v)``, has v segments per stage, one
    per round). Without ``rank_load``: equal layer counts (the first ones one layer
    longer). With it (seconds of other work per pipeline rank, timed on ``hardware``): the
    stages' layer counts minimise the busiest rank's total, min-max over the chain order,
    each stage's count then cut evenly into its segments and pieces. ``name``: which encoder
    (needed when the model has several). ``shift[i]``: move the boundary after segment i by
    that many layers (a neighbour of the balanced cut, for a search by simulation);
    ``segments``: each segment's layer count, given (the search's other candidates)."""
    encoders = dict(split_chain(chain)[0])
    if name is None:
        if len(encoders) != 1:
            raise PlanError(f"name one of the encoders {sorted(encoders)}")
        name = next(iter(encoders))
    layers = [l for l in encoders[name] if l.kind.endswith("_layer")]
    n = len(encoder_ranks)
    if n > len(layers):
        raise PlanError(f"{n} pieces of encoder {name!r} but it has {len(layers)} layers: lower "
                        "--encoder-pieces, --encoder-pipeline-model-parallel-size or "
                        "--encoder-virtual-pipeline-model-parallel-size")
    runs = [(r, len(list(g))) for r, g in groupby(encoder_ranks)]  # the segments
    stage_ranks = list(dict.fromkeys(encoder_ranks))  # in layer order
    virtual = len(runs) // len(stage_ranks)
    if (stage_ranks not in (sorted(stage_ranks), sorted(stage_ranks)[::-1])
            or runs != runs[:len(stage_ranks)] * virtual):
        raise PlanError("encoder pieces must run on non-decreasing or non-increasing pipeline "
                        "ranks, or on such a sequence repeated (an interleaved encoder, as "
                        "many pieces per rank each round): each rank holds one range of an "
                        f"encoder's layers per round (got ranks {list(encoder_ranks)})")
    per_segment = [k for _, k in runs]  # pieces per segment
    per_stage = [virtual * k for _, k in runs[:len(stage_ranks)]]
    if segments:
        if (len(segments) != len(runs) or sum(segments) != len(layers)
                or any(size < k for size, k in zip(segments, per_segment))):
            raise PlanError(f"encoder {name!r}: segment sizes {list(segments)} do not cut its "
                            f"{len(layers)} layers into {len(runs)} segments of at least "
                            "their pieces each")
        sizes = list(segments)
    elif rank_load is None:
        ends = list(accumulate(per_segment))
        even = _even(len(layers), n)
        sizes = [sum(even[e - k:e]) for e, k in zip(ends, per_segment)]
    else:
        time = TimeModel(hardware or Hardware())
        work = prefix_sums([layer_seconds(l, time) for l in layers])
        stage_sizes = minmax_split(  # a stage too short for its pieces costs inf
            len(layers), len(stage_ranks),
            lambda i, j, g: (rank_load[stage_ranks[g]] + work[j] - work[i]
                             if j - i >= per_stage[g] else math.inf))[1]
        if stage_sizes is None:
            raise PlanError(f"the encoder's {len(layers)} layers cannot fill {n} pieces")
        rounds = [_even(size, virtual) for size in stage_sizes]
        sizes = [rounds[g][v] for v in range(virtual) for g in range(len(stage_ranks))]
    if any(shift):
        cuts = list(accumulate(sizes))[:-1]
        cuts = [c + d for c, d in zip(cuts, list(shift) + [0] * len(cuts))]
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [len(layers)])]
        if any(size < k for size, k in zip(sizes, per_segment)):
            raise PlanError(f"shifting the encoder's stage boundaries by {list(shift)} leaves "
                            "a stage fewer layers than pieces")
    sizes = [s for size, k in zip(sizes, per_segment) for s in _even(size, k)]
    bounds, start = [], 0
    for size in sizes:
        bounds.append([start, start + size])
        start += size
    return EncoderPieces(name=name, layers=bounds, ranks=list(encoder_ranks))


# An interleaved encoder's cuts tried outright up to this many (else its shifts only).
SEGMENT_CUTS = 200


def segment_cuts(layers: int, segments: int, pieces: int) -> List[Tuple[int, ...]]:
    """Every cut of ``layers`` layers into ``segments`` consecutive segments of at least
    ``pieces`` layers, when there are at most ``SEGMENT_CUTS`` of them (else none)."""
    spare = layers - segments * pieces
    if spare < 0 or math.comb(spare + segments - 1, segments - 1) > SEGMENT_CUTS:
        return []
    return [tuple(pieces + b - a - 1 for a, b in zip((-1,) + bars, bars + (spare + segments - 1,)))
            for bars in combinations(range(spare + segments - 1), segments - 1)]


def encoder_replica_of(microbatch: int, replicas: int) -> int:
    """The encoder replica that runs micro-batch ``microbatch``'s encoder forward and
    backward: round robin, ``microbatch % replicas``, so consecutive micro-batches (which
    the schedules start one after another) go to different replicas and every replica gets
    an equal share (within one) of any iteration."""
    if replicas < 1:
        raise PlanError(f"encoder replicas must be >= 1, got {replicas}")
    if microbatch < 0:
        raise PlanError(f"micro-batch index must be >= 0, got {microbatch}")
    return microbatch % replicas


def _even(total: int, parts: int) -> List[int]:
    return [total // parts + (p < total % parts) for p in range(parts)]


def separate_placements(chain: Sequence[Layer], llm_partition: StagePartition,
                        pieces: Sequence[EncoderPieces]) -> List[ChunkPlacement]:
    """Every chunk's modules: the LLM by ``llm_partition`` (over the LLM's own chain), each
    rank's pieces of each encoder in its first chunk (an interleaved encoder's as one
    range per round), the encoders' output norms and projectors in chunk 0."""
    placements = chunk_placements(split_chain(chain)[1], llm_partition)
    for place in placements:
        place.encoder_separate = True
    for enc in pieces:
        for rank in sorted(set(enc.ranks)):
            mine = enc.of_rank(rank)
            ranges = []  # consecutive pieces joined: one range per round (interleaving)
            for p in mine:
                if ranges and ranges[-1][1] == enc.layers[p][0]:
                    ranges[-1][1] = enc.layers[p][1]
                else:
                    ranges.append(list(enc.layers[p]))
            placements[rank].encoders.append(EncoderPlacement(
                name=enc.name, embed=0 in mine, layers=ranges[0], interleaved=ranges[1:]))
        first = placements[0].encoder(enc.name)
        if first is None:
            first = EncoderPlacement(name=enc.name)
            placements[0].encoders.append(first)
        first.projector = True
    return placements


def chain_unit(layer: Layer, time: TimeModel, chain_tp: int = 1,
               tp: Optional[int] = None) -> UnitSeconds:
    """A training chain layer (its costs per rank at ``chain_tp``, the chain's TP) run at
    ``tp`` (default ``chain_tp``; an encoder layer at the encoder TP), timed by the one
    time model: a transformer layer adds its 2 TP all-reduces of its output per forward."""
    tp = tp or chain_tp
    return time.unit(layer.fwd_flops * chain_tp, layer.bwd_flops * chain_tp, tp,
                     layer.out_bytes * chain_tp,
                     2 if layer.kind in TRANSFORMER_KINDS else 0, layer.recompute,
                     layer.runs_backward)


def expert_chunks(chunks: Sequence[Sequence[Layer]]) -> List[int]:
    """The chunks (lists of chain layers) whose MoE layers run expert all-to-alls (expert
    parallelism > 1): where ``add_expert_all_to_alls`` puts them."""
    return [c for c, layers in enumerate(chunks) if any(l.a2a_bytes for l in layers)]


def _all_to_alls(costs: ActionCosts, chunks, time: TimeModel) -> None:
    """``costs`` charge each chunk's expert all-to-alls (as actions), if it has any."""
    if expert_chunks(chunks):
        costs.all_to_all_s, costs.backward_all_to_all_s = (
            list(t) for t in zip(*(time.expert_all_to_all_s(c) for c in chunks)))


def layer_seconds(layer: Layer, time: TimeModel) -> float:
    """A chain layer's forward plus backward seconds of one micro-batch (``chain_unit``)."""
    unit = chain_unit(layer, time)
    return unit.forward_s + unit.backward_s


def chunk_deepstack_bytes(chain: Sequence[Layer], chunks: Sequence[Sequence[Layer]]
                          ) -> List[float]:
    """DeepStack bytes beside each LLM chunk's output (``chunks``: the LLM's layers): after
    its last LLM layer, or (chunk 0 without one) all the merged features."""
    return [c[-1].deepstack_bytes if c[-1].kind != "llm_embed" else
            sum(l.deepstack_bytes for l in chain if l.kind == "projector") for c in chunks]


def schedule_costs(chain: Sequence[Layer], llm_partition: StagePartition,
                   pieces: Sequence[EncoderPieces], hardware: Hardware, p2p_s: float = 0.0,
                   *, links: Optional[Interconnect] = None, tensor_model_parallel_size: int = 1,
                   encoder_tensor_model_parallel_size: Optional[int] = None) -> ActionCosts:
    """Per-action seconds of one micro-batch: LLM chunk c's layers (chunk 0 with the
    projectors), each encoder's piece p's layers (piece 0 with its patch embedding), the
    encoders' pieces one after the other; each layer timed by ``unit_costs.TimeModel``
    (``hardware``, and the TP all-reduces on ``links``: None, free). ``chain``'s costs are
    per rank at ``tensor_model_parallel_size``; the encoder layers run at
    ``encoder_tensor_model_parallel_size`` (default the same), r = TP / encoder TP replicas
    taking turns with the micro-batches (each piece 1 / r of its time per rank, plus each
    encoder's output broadcast and the replicas' gradient sum). The separate placement's
    pieces (``separate_model_placements``: each encoder whole) give its program's costs,
    the tower's message with every DeepStack layer's output."""
    encoders, llm = split_chain(chain)
    encoders = dict(encoders)
    time = TimeModel(hardware, links)
    tp = tensor_model_parallel_size
    etp = encoder_tensor_model_parallel_size or tp
    share = replica_share(tp, etp)
    replicas = tp // etp

    def units(layers, at=tp, scale=1.0):
        return [chain_unit(l, time, tp, at) for l in layers], scale

    chunks = [llm[s:e] for s, e in llm_partition.chunk_bounds()]
    deepstack = chunk_deepstack_bytes(chain, chunks)
    piece_deepstack = []
    per_piece, bcast, ranks_params = [], [], {}
    for enc in pieces:
        encoder = encoders[enc.name]
        chunks[0] = chunks[0] + [l for l in encoder if l.kind == "projector"]
        embed = [l for l in encoder if l.kind.endswith("_embed")]
        layers = [l for l in encoder if l.kind.endswith("_layer")]
        for p, (s, e) in enumerate(enc.layers):
            mine = layers[s:e] + (embed if p == 0 else [])
            piece_deepstack.append(layers[e - 1].deepstack_bytes)
            per_piece.append(units(mine, etp, share))
            last = p == len(enc.layers) - 1
            bcast.append(time.broadcast_s(layers[-1].out_bytes * tp, tp) if last else 0.0)
            if enc.ranks:  # none: the separate placement's (on encoder ranks of their own)
                trained = sum(l.params * tp / etp for l in mine if l.trainable)
                ranks_params[enc.ranks[p]] = ranks_params.get(enc.ranks[p], 0.0) + trained
    per_chunk = [units(c) for c in chunks]
    total = lambda us, what: us[1] * sum(getattr(u, what) for u in us[0])  # noqa: E731
    costs = ActionCosts(forward_s=[total(c, "forward_s") for c in per_chunk],
                        backward_s=[total(c, "backward_s") for c in per_chunk],
                        encoder_forward_s=[total(p, "forward_s") for p in per_piece],
                        encoder_backward_s=[total(p, "backward_s") for p in per_piece],
                        p2p_s=p2p_s)
    if any(deepstack) or any(piece_deepstack):
        costs.deepstack_p2p_s = [time.p2p_s(b) for b in deepstack]
        costs.encoder_deepstack_p2p_s = [time.p2p_s(b) for b in piece_deepstack]
    if links is not None:
        costs.forward_comm_s = [total(c, "forward_comm_s") for c in per_chunk]
        costs.backward_comm_s = [total(c, "backward_comm_s") for c in per_chunk]
        costs.encoder_forward_comm_s = [total(p, "forward_comm_s") for p in per_piece]
        costs.encoder_backward_comm_s = [total(p, "backward_comm_s") for p in per_piece]
        _all_to_alls(costs, chunks, time)
        if replicas > 1:
            ranks = max(llm_partition.pipeline_model_parallel_size, 1)
            costs.broadcast_s = bcast
            costs.replica_allreduce_s = [time.replica_allreduce_s(ranks_params.get(r, 0.0),
                                                                  replicas)
                                         for r in range(ranks)]
    return costs


def megatron_costs(chain: Sequence[Layer], partition: StagePartition, hardware: Hardware,
                   p2p_s: float = 0.0, *, links: Optional[Interconnect] = None,
                   tensor_model_parallel_size: int = 1) -> ActionCosts:
    """Per-chunk seconds of the whole chain partitioned as Megatron runs it (the encoder
    inside the chunks that hold it, at the LLM's TP): the ``megatron`` schedule's costs,
    timed as ``schedule_costs``."""
    time = TimeModel(hardware, links)
    tp = tensor_model_parallel_size
    layers = [chain[s:e] for s, e in partition.chunk_bounds()]
    chunks = [[chain_unit(l, time, tp) for l in c] for c in layers]
    costs = ActionCosts(forward_s=[sum(u.forward_s for u in c) for c in chunks],
                        backward_s=[sum(u.backward_s for u in c) for c in chunks], p2p_s=p2p_s)
    deepstack = [chain[e - 1].deepstack_bytes for _, e in partition.chunk_bounds()]
    if any(deepstack):  # beside the chunks' outputs (DeepStack)
        costs.deepstack_p2p_s = [time.p2p_s(b) for b in deepstack]
    if links is not None:
        costs.forward_comm_s = [sum(u.forward_comm_s for u in c) for c in chunks]
        costs.backward_comm_s = [sum(u.backward_comm_s for u in c) for c in chunks]
        _all_to_alls(costs, layers, time)
    return costs


@dataclass
class EncoderPipelinePlan(Record):
    """Where the LLM chunks and each encoder's pieces run, and which encoders train."""

    llm_partition: StagePartition
    pieces: List[EncoderPieces]  # per encoder, in chain order
    placements: List[ChunkPlacement]
    trainable: List[bool]  # per encoder
    reverse: bool = False  # the encoders' first stage on the last rank

    @property
    def encoder_trainable(self) -> bool:
        """Whether any encoder runs backwards."""
        return any(self.trainable)

    @property
    def frozen_encoders(self) -> List[int]:
        """The encoders without backward, as the schedules index them."""
        return [e for e, t in enumerate(self.trainable) if not t]


def plan_encoder_pipeline(chain: Sequence[Layer], pp: int, vpp: int, policy,
                          encoder_pp: Optional[int] = None, pieces_per_stage: int = 1,
                          num_microbatches: int = 1, hardware: Optional[Hardware] = None,
                          reverse: bool = False, shift: Sequence[int] = (),
                          virtual: int = 1, segments: Sequence[int] = ()
                          ) -> EncoderPipelinePlan:
    """The LLM partitioned over its own chain by ``policy`` (as ``--pipeline-partition``),
    each encoder over ``encoder_pp`` stages of ``pieces_per_stage`` pieces (``reverse``: the
    first stage on the last rank; ``virtual`` rounds over the stages: interleaved;
    ``generate.encoder_placement``): equal layer counts with ``uniform``, else balancing
    each rank's total work on ``hardware`` (the LLM's, the encoders' placed before, this
    encoder's); ``shift`` moves each encoder's segment boundaries off that balance, and
    ``segments`` gives the first encoder's segment sizes outright (``encoder_pieces``)."""
    encoders, llm = split_chain(chain)
    part = partition(llm, pp, vpp, policy, num_microbatches=num_microbatches)
    _, ranks = encoder_placement(pp, encoder_pp, pieces_per_stage, reverse, virtual)
    hw = hardware or Hardware()
    time = TimeModel(hw)
    load = None
    if policy != "uniform":  # balance each rank's LLM and encoder work together
        costs = schedule_costs(chain, part, [], hw)
        load = [0.0] * pp
        for c in range(part.num_chunks):
            load[part.rank_of_chunk(c)] += costs.forward_s[c] + costs.backward_s[c]
    pieces = []
    for name, encoder in encoders:
        if load is not None:  # its projector runs with LLM chunk 0, its embedding first
            for layer in encoder:
                if layer.kind == "projector" or layer.kind.endswith("_embed"):
                    load[part.rank_of_chunk(0) if layer.kind == "projector" else ranks[0]] += \
                        layer_seconds(layer, time)
        enc = encoder_pieces(chain, ranks, load, hw, name, shift,
                             segments if not pieces else ())
        pieces.append(enc)
        if load is not None:
            layers = [l for l in encoder if l.kind.endswith("_layer")]
            for (s, e), rank in zip(enc.layers, enc.ranks):
                load[rank] += sum(layer_seconds(l, time) for l in layers[s:e])
    return EncoderPipelinePlan(
        llm_partition=part, pieces=pieces,
        placements=separate_placements(chain, part, pieces),
        trainable=[any(l.trainable for l in encoder if l.kind.endswith(("_layer", "_embed")))
                   for _, encoder in encoders], reverse=reverse)

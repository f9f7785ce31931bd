"""Where each module of the model runs: a partition of the chain read as per-chunk modules.

The runtime builds model chunk c from ``chunk_placements(chain, partition)[c]``: the LLM
embedding (always chunk 0), for each encoder its embedding, a range of its transformer
layers and its projector, then a range of LLM decoder layers and the output layer. A cut
inside an encoder sends that encoder's hidden state along with the text embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..errors import PlanError
from ..record import Record
from .layers import LLM, Layer
from .partition import StagePartition


@dataclass
class EncoderPlacement(Record):
    """The part of encoder ``name`` in one chunk; ``layers`` is [start, end), and
    ``interleaved`` the further ranges an interleaved encoder holds there (one per later
    round: ``--encoder-virtual-pipeline-model-parallel-size``)."""

    name: str
    embed: bool = False
    layers: List[int] = field(default_factory=lambda: [0, 0])
    projector: bool = False
    interleaved: List[List[int]] = field(default_factory=list)

    @property
    def ranges(self) -> List[List[int]]:
        """Every [start, end) of its layers here, in layer order (empty ones left out)."""
        return [r for r in [self.layers] + self.interleaved if r[1] > r[0]]

    @property
    def num_layers(self) -> int:
        return sum(end - start for start, end in self.ranges)


@dataclass
class ChunkPlacement(Record):
    """Model chunk ``chunk`` (virtual stage ``chunk // PP`` of pipeline rank ``chunk % PP``)."""

    chunk: int
    llm_embed: bool = False
    encoders: List[EncoderPlacement] = field(default_factory=list)
    llm_layers: List[int] = field(default_factory=lambda: [0, 0])
    llm_head: bool = False
    receives_encoder: Optional[str] = None  # cut inside this encoder before the chunk
    sends_encoder: Optional[str] = None  # cut inside this encoder after the chunk
    # The encoder runs as its own pipeline (encoder_pipeline.py): this chunk's encoder part
    # runs as separate actions, and chunk 0 merges features handed to it.
    encoder_separate: bool = False
    # The encoders run on ranks of their own (the separate placement): their outputs
    # arrive whole, without the encoder's sequence-parallel padding or shard.
    encoder_ranks_own: bool = False

    @property
    def num_llm_layers(self) -> int:
        return self.llm_layers[1] - self.llm_layers[0]

    def encoder(self, name: str) -> Optional[EncoderPlacement]:
        return next((e for e in self.encoders if e.name == name), None)

    @property
    def runs_llm(self) -> bool:
        """Whether the LLM's decoder or head runs here (else the chunk hands embeddings on)."""
        return self.num_llm_layers > 0 or self.llm_head

    def deepstack_layers(self, encoder: str, num_layers: int, sent: bool) -> range:
        """DeepStack (Qwen3-VL): of the first ``num_layers`` LLM layers, which add encoder
        ``encoder``'s merged features, those whose features this chunk sends on with its
        output (``sent``: the layers after its own, from the chunk that merges them on) or
        receives with its input (those it holds or follow, unless it merges them itself)."""
        part = self.encoder(encoder)
        merges = part is not None and part.projector
        start, end = self.llm_layers if self.num_llm_layers else (0, 0)
        if sent:
            return range(end, num_layers) if (merges or self.num_llm_layers) and not \
                self.llm_head else range(0)
        return range(start, num_layers) if self.num_llm_layers and not merges else range(0)


def chunk_placements(chain: Sequence[Layer], part: StagePartition) -> List[ChunkPlacement]:
    if part.num_layers != len(chain):
        raise PlanError(f"the partition covers {part.num_layers} layers but the model's chain "
                        f"has {len(chain)}")
    out = []
    sends = None
    for c, (start, end) in enumerate(part.chunk_bounds()):
        place = ChunkPlacement(chunk=c, receives_encoder=sends)
        for layer in chain[start:end]:
            _add(place, layer)
        last = chain[end - 1]
        sends = last.branch if last.branch != LLM and last.kind != "projector" else None
        place.sends_encoder = sends
        out.append(place)
    return out


def whole_model(chain: Sequence[Layer]) -> ChunkPlacement:
    """Everything in one chunk (no pipeline parallelism)."""
    return chunk_placements(chain, StagePartition(1, 1, [len(chain)], "uniform"))[0]


def megatron_layout(placements: Sequence[ChunkPlacement], encoder: Optional[str] = None,
                    pp: Optional[int] = None) -> List[List[str]]:
    """Megatron-Core's ``pipeline_model_parallel_layout`` (chunk order) for the LLM, or for
    ``encoder``'s transformer layers: the decoder layers per chunk, with the embedding and
    loss markers Megatron requires on the first and last chunk (they only anchor the layout;
    an encoder's own embedding and projector are placed by ``ChunkPlacement``). An
    interleaved encoder (``EncoderPlacement.interleaved``, in each rank's first chunk, over
    ``pp`` ranks) gets a layout of its own rounds: round v's range of rank r at v * PP + r."""
    layout = []
    if encoder is not None and _rounds(placements, encoder) > 1:
        if pp is None:
            raise PlanError(f"encoder {encoder!r} is interleaved: its layout needs the "
                            "pipeline size")
        for v in range(_rounds(placements, encoder)):
            for place in placements[:pp]:
                part = place.encoder(encoder)
                ranges = [part.layers] + part.interleaved if part else []
                layout.append(["decoder"] * (ranges[v][1] - ranges[v][0]
                                             if v < len(ranges) else 0))
    else:
        for place in placements:
            if encoder is None:
                n = place.num_llm_layers
            else:
                part = place.encoder(encoder)
                n = part.num_layers if part else 0
            layout.append(["decoder"] * n)
    layout[0].insert(0, "embedding")
    layout[-1].append("loss")
    return layout


def _rounds(placements: Sequence[ChunkPlacement], encoder: str) -> int:
    """How many ranges of ``encoder``'s layers a rank holds at most (interleaving: > 1)."""
    return 1 + max((len(p.encoder(encoder).interleaved) for p in placements
                    if p.encoder(encoder)), default=0)


def stack_layout(placements: Sequence[ChunkPlacement], pp: int,
                 encoder: Optional[str] = None) -> Tuple[List[List[str]], bool]:
    """(Megatron-Core layout, mirrored) for the LLM or ``encoder``'s transformer layers over
    ``pp`` pipeline ranks. Megatron-Core numbers a stack's layers in pipeline-rank order;
    an encoder placed from the last rank (``encoder_placement(reverse=True)``: its first
    layers on the later rank) is laid out over mirrored ranks (rank r's layers at position
    PP - 1 - r), and its layers are built seeing rank PP - 1 - r (``mirrored``), so each
    part still numbers its layers globally (checkpoints do not depend on the placement).
    An interleaved encoder's layout has one stage per rank and round (``megatron_layout``)."""
    layout = megatron_layout(placements, encoder, pp)
    if encoder is None:
        return layout, False
    holders = [(r, p.chunk) for p in placements if p.encoder(encoder)
               for r in p.encoder(encoder).ranges]
    by_layer = [c for _, c in sorted(holders)]
    rounds = _rounds(placements, encoder)
    if rounds > 1:
        first_round = by_layer[:len(by_layer) // rounds]
        if any(c >= pp for c in by_layer) or by_layer != first_round * rounds or not (
                first_round == sorted(first_round) or first_round == sorted(first_round)[::-1]):
            raise PlanError(f"encoder {encoder!r}: an interleaved encoder's layers must run "
                            "over the pipeline ranks in order (or in reverse order), the same "
                            f"each round, in each rank's first chunk (chunks {by_layer})")
        if first_round == sorted(first_round):
            return layout, False
        return _mirror(layout, pp), True
    if by_layer == sorted(by_layer):
        return layout, False  # layer order is chunk order
    if any(c >= pp for c in by_layer) or by_layer != sorted(by_layer, reverse=True):
        raise PlanError(f"encoder {encoder!r}: its layers must run in pipeline order, or in "
                        f"reverse pipeline order in each rank's first chunk (chunks {by_layer})")
    return _mirror(layout, pp), True


def _mirror(layout: List[List[str]], pp: int) -> List[List[str]]:
    """Rank r's stages at rank PP - 1 - r, in every virtual stage; the markers re-anchored."""
    mirrored = [list(layout[c - c % pp + pp - 1 - c % pp]) for c in range(len(layout))]
    for stage in mirrored:
        for marker in ("embedding", "loss"):
            if marker in stage:
                stage.remove(marker)
    mirrored[0].insert(0, "embedding")
    mirrored[-1].append("loss")
    return mirrored


def _add(place: ChunkPlacement, layer: Layer) -> None:
    if layer.kind == "llm_embed":
        place.llm_embed = True
    elif layer.kind == "llm_layer":
        place.llm_layers = _extend(place.llm_layers, _index(layer), layer)
    elif layer.kind == "llm_head":
        place.llm_head = True
    else:
        enc = place.encoder(layer.branch)
        if enc is None:
            enc = EncoderPlacement(name=layer.branch)
            place.encoders.append(enc)
        if layer.kind == "projector":
            enc.projector = True
        elif layer.kind.endswith("_embed"):
            enc.embed = True
        else:
            enc.layers = _extend(enc.layers, _index(layer), layer)


def _index(layer: Layer) -> int:
    """Layer i of ``...decoder.layers.i``."""
    return int(layer.module.rsplit(".", 1)[1])


def _extend(bounds: List[int], i: int, layer: Layer) -> List[int]:
    if bounds[1] == bounds[0]:
        return [i, i + 1]
    if i != bounds[1]:
        raise PlanError(f"layer {layer.module} does not follow layer {bounds[1] - 1} of its "
                        "stack; a chunk holds consecutive layers")
    return [bounds[0], i + 1]

"""Where a micro-batch's media features and losses go, computed on the host.

On a GPU, reading a device value on the host (``int(t)``, ``.tolist()``, a boolean mask
whose selection sizes an output) stalls the host until the device catches up, once per
micro-batch. So the model's forward takes every size and position it needs from a
``BatchLayout`` that the training step computes from the batch while it is still on the
host, and uses only index ops of known sizes (``index_select`` / ``index_copy``). The
placeholder checks that need values (``MediaMismatchError``) run here too, before anything
reaches the device.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch

from ..config import MultimodalModelConfig
from ..families import family_of
from ..plan.context_parallel.encoder_split import split_items
from .host_copy import to_device


class MediaMismatchError(ValueError):
    """The placeholder tokens of a batch do not match its media."""


class EncoderCP(NamedTuple):
    """``--vision-dp-when-cp``: the CP group the encoders' items are split over."""

    size: int
    rank: int
    group: Any  # torch.distributed.ProcessGroup


@dataclass
class FeatureShare:
    """An encoder's features under ``--vision-dp-when-cp``: each CP rank projects its own
    items' (``counts``: feature rows per rank, after each item's padding is dropped) and
    ``order`` ([sum(counts)] long) puts the ranks' rows, concatenated in rank order, at
    their rows of the whole batch's features (``cp_gather.gather_rows``)."""

    counts: List[int]
    order: torch.Tensor
    group: Any

    def to(self, device) -> "FeatureShare":
        return FeatureShare(self.counts, to_device(self.order, device), self.group)


@dataclass
class BatchLayout:
    """Per encoder name: ``items`` (media items in the batch), ``slots`` ([n] long: the
    placeholder positions in the sequence-first [S, B] text, flattened, in the batch's
    row-major (sample, position) order: the order of the features) and ``keep`` ([n]
    long: which rows of the flattened [N, T'] features fill them; None: all, in order).
    ``loss_positions`` ([K] long, or None: no loss mask): where the loss is taken in the
    flattened [S, B] output of the tokens this rank runs (its CP share)."""

    items: Dict[str, int] = field(default_factory=dict)
    slots: Dict[str, torch.Tensor] = field(default_factory=dict)
    keep: Dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    loss_positions: Optional[torch.Tensor] = None
    # Per encoder name: (T, N) of its hidden state, for families whose shape varies by
    # batch (``EncoderFamily.hidden_shape``), and the family's prepared batch
    # (``EncoderFamily.prepare_batch``: indices and masks from host metadata).
    hidden_shapes: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    encoder_batches: Dict[str, Any] = field(default_factory=dict)
    # ``--vision-dp-when-cp``, per encoder name with items in the batch: its ``FeatureShare``
    # and the media of this CP rank's items, which it encodes (``items``, ``keep``,
    # ``hidden_shapes`` and ``encoder_batches`` are then those of these items).
    shares: Dict[str, FeatureShare] = field(default_factory=dict)
    encoder_media: Dict[str, Dict[str, torch.Tensor]] = field(default_factory=dict)
    # [B, S] bool, True at the rows' padding (past their ``seq_lengths``): Megatron-Core's
    # MoE ``padding_mask``, which keeps padding out of the routers' statistics (set for an
    # MoE LLM only; None: every position counts).
    padding: Optional[torch.Tensor] = None

    def to(self, device) -> "BatchLayout":
        def move(t):
            return None if t is None else to_device(t, device)
        return BatchLayout(dict(self.items), {k: move(v) for k, v in self.slots.items()},
                           {k: move(v) for k, v in self.keep.items()},
                           move(self.loss_positions), dict(self.hidden_shapes),
                           {k: v.to(device) for k, v in self.encoder_batches.items()},
                           {k: v.to(device) for k, v in self.shares.items()},
                           {k: {m: move(t) for m, t in v.items()}
                            for k, v in self.encoder_media.items()},
                           move(self.padding))


def padding_positions(seq_lengths: torch.Tensor, length: int) -> torch.Tensor:
    """[B, length] bool: True past each row's length (its padding)."""
    return torch.arange(length).unsqueeze(0) >= seq_lengths.cpu().unsqueeze(1)


def loss_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] loss mask -> the flat positions in [S, B] order where it is set."""
    return torch.nonzero(loss_mask.detach().cpu().transpose(0, 1).reshape(-1) > 0).view(-1)


def batch_layout(config: MultimodalModelConfig, media_token_ids: Mapping[str, int],
                 tokens: torch.Tensor, media: Mapping[str, torch.Tensor],
                 loss_mask: Optional[torch.Tensor] = None,
                 encoder_cp: Optional[EncoderCP] = None) -> BatchLayout:
    """The layout of a batch on the host (``tokens`` [B, S], ``media`` as collated; the
    loss mask of the tokens this rank runs; ``encoder_cp``: each CP rank encodes a share
    of the items, ``--vision-dp-when-cp``). Raises ``MediaMismatchError`` when the
    placeholders do not match the media."""
    tokens = tokens.detach().cpu()
    b, s = tokens.shape
    layout = BatchLayout(
        loss_positions=None if loss_mask is None else loss_positions(loss_mask))
    for name, enc in config.encoders.items():
        family = family_of(enc)
        # modality by modality, each in row-major (sample, position) order, as flat [S, B]
        # positions: the order of the features
        found = [torch.nonzero(tokens == media_token_ids[m], as_tuple=True)
                 for m in family.modalities]
        slots = torch.cat([cols * b + rows for rows, cols in found])
        modality = "/".join(family.modalities)
        n_items, per_item = family.feature_tokens(enc, media)
        if isinstance(per_item, dict):  # per modality: each one's placeholders must match
            for m, (rows, _) in zip(family.modalities, found):
                want = sum(per_item.get(m, ()))
                if len(rows) != want:
                    raise MediaMismatchError(f"batch has {len(rows)} {m} placeholder tokens "
                                             f"but its {m} items give {want} tokens")
            per_item = [n for m in family.modalities for n in per_item.get(m, ())]
        if per_item is None:
            width = enc.num_output_tokens
            expected, what = n_items * width, f"x {width} tokens each"
        else:
            expected = sum(per_item)
            what = f"(their lengths give {expected} tokens)"
        if len(slots) != expected:
            raise MediaMismatchError(
                f"batch has {len(slots)} {modality} placeholder tokens but "
                f"{n_items} {modality} items {what}")
        layout.slots[name] = slots
        items_media = media
        if encoder_cp is not None and encoder_cp.size > 1 and n_items:
            mine = _share_items(layout, name, family, enc, n_items, per_item, encoder_cp)
            items_media = layout.encoder_media[name] = family.select(enc, media, mine)
            n_items = len(mine)
            per_item = None if per_item is None else [per_item[i] for i in mine]
        _add_items(layout, name, family, enc, items_media, n_items, per_item)
    return layout


def _share_items(layout: BatchLayout, name: str, family, enc, n_items: int,
                 per_item: Optional[List[int]], cp: EncoderCP) -> List[int]:
    """Split encoder ``name``'s items over the CP ranks by their vision work (a packed
    variable-length encoder's work is each item's tokens; a fixed-length one runs every
    item at the same length) and record the ``FeatureShare``; this rank's items."""
    rows = per_item or [enc.num_output_tokens] * n_items  # feature rows, padding dropped
    work = rows if family.hidden_shape is not None else [1] * n_items
    split = split_items(work, cp.size)
    start = [0, *itertools.accumulate(rows[:-1])]  # each item's first feature row
    ranks = [split.items(r) for r in range(cp.size)]
    order = [torch.arange(start[i], start[i] + rows[i]) for items in ranks for i in items]
    layout.shares[name] = FeatureShare([sum(rows[i] for i in items) for items in ranks],
                                       torch.cat(order), cp.group)
    return ranks[cp.rank]


def _add_items(layout: BatchLayout, name: str, family, enc, media, n_items: int,
               per_item: Optional[List[int]]) -> None:
    """The encoder's items in ``media`` (the batch's, or this CP rank's share)."""
    keep = None
    if per_item and family.padded_features:  # drop each item's padding rows
        width = enc.num_output_tokens
        keep = torch.cat([torch.arange(n, dtype=torch.long) + i * width
                          for i, n in enumerate(per_item)])
    layout.items[name], layout.keep[name] = n_items, keep
    if n_items and family.hidden_shape is not None:
        layout.hidden_shapes[name] = family.hidden_shape(enc, media)
    if n_items and family.prepare_batch is not None:
        layout.encoder_batches[name] = family.prepare(enc, media)

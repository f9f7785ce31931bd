"""Training and validation data from the flags: JSONL files or Megatron-Energon datasets,
one or a weighted blend (``--data-path 0.7 A 0.3 B``), and the data-parallel batch
iterators that read them.

``--data-path`` entries are all of one kind:

- JSONL: a ``.jsonl`` file, or a directory holding ``train.jsonl`` (and ``valid.jsonl``,
  the validation data unless ``--valid-data-path`` is given; a blend's validation data
  is its members' ``valid.jsonl`` files, concatenated). Blends mix by Megatron-Core's
  blending indices (``blend.BlendedDataset``), then ``MegatronPretrainingSampler``
  shuffles and shards them.
- Energon: a prepared dataset directory (``.nv-meta/``) or a metadataset ``.yaml``.
  Training reads its ``train`` split with Energon's savable loader, sharded by
  data-parallel rank; a blend becomes an Energon metadataset blend. Validation reads
  the ``val`` split in order (or ``--valid-data-path``). The loader's state is saved
  in each checkpoint (Megatron-LM's ``train_dataloader_dprank000.pt``) and restored on
  resume, so a run continues mid-epoch with the same samples.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils.data import ConcatDataset

from .blend import BlendedDataset
from .dataset import MultimodalDataset
from .sources import DataConfigError, DataSources

DATALOADER_STATE = "train_dataloader_dprank{:03d}.pt"  # Megatron-LM's file name


@dataclass
class EncodingSettings:
    """How records become samples: the model's media and sequence settings."""

    tokenizer: object
    media_token_counts: dict
    image_cfg: object
    max_seq_length: Optional[int]
    audio_cfg: object
    bad_record_policy: str = "fail"
    pad_to_multiple_of: int = 1  # micro-batch length multiple (the JSONL path's collate's)
    processors: Optional[dict] = None  # modality -> the encoder family's media processor

    def dataset(self, records) -> MultimodalDataset:
        return MultimodalDataset(records, self.tokenizer, self.media_token_counts,
                                 self.image_cfg, max_seq_length=self.max_seq_length,
                                 audio_cfg=self.audio_cfg,
                                 bad_record_policy=self.bad_record_policy,
                                 processors=self.processors)

    def task_encoder(self, packing_seq_length: Optional[int] = None):
        from .energon import RecordTaskEncoder

        return RecordTaskEncoder(self.tokenizer, self.media_token_counts, self.image_cfg,
                                 self.max_seq_length, self.audio_cfg, self.bad_record_policy,
                                 packing_seq_length, self.pad_to_multiple_of,
                                 self.processors)


class EnergonTrainData:
    """The training data when it is Energon's: read through ``batches``, not indexed."""

    def __init__(self, sources: DataSources, encoding: EncodingSettings):
        from .energon import blend_metadataset

        self.sources, self.encoding = sources, encoding
        self.path = (blend_metadataset(sources.train, sources.weights)
                     if sources.weights is not None else sources.train[0])
        self.num_samples = sum(_energon_split_size(p, "train") for p in sources.train)

    def __len__(self) -> int:  # samples in the train split (blend: all members')
        return self.num_samples

    def batches(self, micro_batch_size: int, dp_rank: int, dp_size: int, num_workers: int,
                seed: int, dp_group=None, state=None, packing_buffer_size=None,
                packing_seq_length=None):
        """This rank's micro-batches (packed sequences with ``packing_buffer_size``)."""
        from .energon import train_batches, worker_config

        config = worker_config(dp_rank, dp_size, num_workers, seed, dp_group)
        packing = packing_seq_length if packing_buffer_size else None
        return train_batches(self.path, self.encoding.task_encoder(packing), config,
                             micro_batch_size, state, packing_buffer_size)


def _energon_split_size(path: str, split: str) -> int:
    """Samples in ``split`` of a prepared dataset (from Energon's .info.json and
    split.yaml); 0 where unknown (a metadataset file)."""
    meta = os.path.join(path, ".nv-meta")
    if not os.path.isdir(meta):
        return 0
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    try:
        wds = WebdatasetMeta.from_config(path=EPath(path), split_part=split)
    except (EmptyDatasetError, AssertionError):  # no such split, or no shards in it
        return 0
    return sum(shard.count for shard in wds.shards)


def build_train_valid_datasets(sources: DataSources, encoding: EncodingSettings,
                               valid_limit: Optional[int] = None,
                               global_batch_size: Optional[int] = None):
    """(training data, validation dataset). Training data is a map-style dataset (JSONL,
    or a BlendedDataset of them) or ``EnergonTrainData``; validation is map-style (an
    Energon ``val`` split is read in order, its first ``valid_limit`` records)."""
    if sources.kind == "energon":
        train = EnergonTrainData(sources, encoding)
    else:
        members = [encoding.dataset(path) for path in sources.train]
        train = (members[0] if sources.weights is None
                 else BlendedDataset(members, sources.weights))
        if global_batch_size is not None and len(train) < global_batch_size:
            raise DataConfigError(f"--data-path: {len(train)} training records, fewer than one "
                                  f"global batch (--global-batch-size {global_batch_size})")
    if sources.valid_kind == "energon":
        from .energon import read_records

        records = []
        for path in sources.valid:
            if os.path.isdir(path) and not _energon_split_size(path, "val"):
                raise DataConfigError(f"{path} has no 'val' split (convert a valid.jsonl with "
                                      "it): pass --valid-data-path")
            records += read_records(path, "val", valid_limit)
        valid = encoding.dataset(records[:valid_limit])
    else:
        parts = [encoding.dataset(path) for path in sources.valid]
        valid = parts[0] if len(parts) == 1 else _Concat(parts)
    return train, valid


class _Concat(ConcatDataset):
    """Validation sets one after another (a blend's members' valid.jsonl)."""

    @property
    def records(self):
        return [r for ds in self.datasets for r in ds.records]


def save_dataloader_state(iterator, directory: str, dp_rank: int) -> None:
    """Write the loader's state (Megatron-LM's file and key) into a checkpoint dir."""
    torch.save({"dataloader_state_dict": iterator.save_state()},
               os.path.join(directory, DATALOADER_STATE.format(dp_rank)))


def load_dataloader_state(directory: str, dp_rank: int, log: Callable[[str], None] = print):
    """The state saved for ``dp_rank`` in a checkpoint dir, or None (with a note)."""
    path = os.path.join(directory, DATALOADER_STATE.format(dp_rank))
    if not os.path.isfile(path):
        log(f" > no data loader state in {directory}: Energon data starts from its beginning")
        return None
    return torch.load(path, weights_only=False)["dataloader_state_dict"]


def savable(iterator):
    """The iterator whose state goes into checkpoints (Energon's), or None: the JSONL
    path resumes from the consumed sample count alone."""
    first = iterator[0] if isinstance(iterator, list) else iterator
    return first if hasattr(first, "save_state") else None

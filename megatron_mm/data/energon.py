"""Megatron-Energon datasets: the package's records as WebDataset shards, read with
Energon's loader (how Megatron-LM's multimodal training reads data).

A shard sample is one record: ``<key>.json`` holds the record as in a JSONL file, with
each media item replaced by the name of a member of the same sample
(``<key>.image0.png``, ``<key>.audio0.wav``) that holds the file's bytes. The dataset is
a ``CrudeWebdataset``, Energon's way for a custom format: the ``cook_record`` cooker
turns a raw sample into a ``Record`` and the task encoder encodes and collates it with
the same code as the JSONL path, so both give the same batches for the same records.
``tools/jsonl_to_energon.py`` writes such a dataset; see docs/data.md.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import tempfile
from functools import partial
from typing import Optional

import numpy as np
import torch

from megatron.energon import (
    Cooker,
    Sample as EnergonSample,
    SkipSample,
    TaskEncoder,
    WorkerConfig,
    basic_sample_keys,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from megatron.energon.edataclass import edataclass
from megatron.energon.errors import reraise_exception

from .packing import collate_packed
from .processing import Sample, collate, encode_record
from .records import MODALITIES, DataRecordError, MediaRef, Record, parse_record

# Megatron-LM's multimodal example reads Energon data with these (dataloader_provider.py).
SHUFFLE_BUFFER_SIZE = 100
MAX_SAMPLES_PER_SEQUENCE = 100


@edataclass
class RecordSample(EnergonSample):
    """A record cooked from a shard sample; media items hold the members' bytes. A
    malformed sample carries its error instead, for the task encoder's policy."""

    record: Optional[Record]
    error: Optional[str] = None

    def checked(self) -> Record:
        if self.error is not None:
            raise DataRecordError(self.error)
        return self.record


@stateless
def cook_record(raw: dict) -> RecordSample:
    """Energon cooker: a crude shard sample (``json`` + media members) -> RecordSample."""
    try:
        return RecordSample(**basic_sample_keys(raw), record=_record(raw))
    except DataRecordError as e:
        return RecordSample(**basic_sample_keys(raw), record=None, error=str(e))


def _record(raw: dict) -> Record:
    key = raw["__key__"]
    shard = _shard_name(raw)
    where = f"{shard} sample {key}"
    try:
        obj = json.loads(raw["json"])
    except (KeyError, ValueError) as e:
        raise DataRecordError(f"{where}: no valid .json member: {e}") from None
    if not isinstance(obj, dict):
        raise DataRecordError(f"{where}: the .json member is not a JSON object")
    source = obj.pop("__source__", None)
    source = f"{where}, from {source}" if source else where
    members = {}
    for spec in MODALITIES.values():  # member names -> inline bytes, checked here
        names = obj.get(spec.record_key, [])
        for i, name in enumerate(names if isinstance(names, list) else []):
            if not isinstance(name, str) or name not in raw:
                raise DataRecordError(f"{source}: {spec.record_key}[{i}] names member "
                                      f"{name!r}, which the sample lacks")
            members[(spec.record_key, i)] = name
        if isinstance(names, list):  # placeholders for the parser; replaced below
            obj[spec.record_key] = [{"data": "-"}] * len(names)
    record = parse_record(obj, source=source, default_id=f"{shard}:{key}")
    for spec_name, spec in MODALITIES.items():
        record.media[spec_name] = [
            MediaRef(raw=raw[members[(spec.record_key, i)]],
                     member=f"{key}.{members[(spec.record_key, i)]}")
            for i in range(len(record.media.get(spec_name, [])))]
    return record


def _shard_name(raw: dict) -> str:
    sources = raw.get("__sources__") or ()
    for src in sources:
        name = getattr(src, "shard_name", None)
        if name:
            return os.path.basename(str(name))
    return "shard"


@edataclass
class EncodedSample(EnergonSample):
    """An encoded sample, carrying Energon's keys (its packing buffer restores by them)."""

    sample: Sample


@edataclass
class PackedSamples(EnergonSample):
    """The encoded samples packed into one sequence."""

    samples: list


class RecordTaskEncoder(TaskEncoder):
    """Cooks records, encodes them as the JSONL path does and collates micro-batches.

    ``bad_record_policy``: "skip" logs the record and drops it (Energon's SkipSample;
    the next sample fills the batch), "fail" raises its DataRecordError.

    With ``packing_seq_length`` (and Energon's ``packing_buffer_size``), samples are packed
    into sequences of at most that many tokens (first fit, in the order the buffer holds
    them), each micro-batch one packed sequence with a block-diagonal mask
    (``collate_packed``, as ``--data-balance`` packs).
    """

    decoder = None  # media stay bytes: the package decodes them as the JSONL path does

    def __init__(self, tokenizer, media_token_counts, image_cfg, max_seq_length=None,
                 audio_cfg=None, bad_record_policy: str = "fail",
                 packing_seq_length: Optional[int] = None, pad_to_multiple_of: int = 1,
                 processors: Optional[dict] = None):
        super().__init__()
        self.cookers = [Cooker(cook_record)]
        self.encode = partial(encode_record, tokenizer=tokenizer,
                              media_token_counts=media_token_counts, image_cfg=image_cfg,
                              max_seq_length=max_seq_length, audio_cfg=audio_cfg,
                              processors=processors)
        self.pad_id = tokenizer.pad_id
        self.bad_record_policy = bad_record_policy
        self.packing_seq_length = packing_seq_length
        self.pad_to_multiple_of = pad_to_multiple_of  # as the JSONL path's collate

    @stateless
    def encode_sample(self, sample: RecordSample):
        try:
            return EncodedSample.derive_from(sample, sample=self.encode(sample.checked()))
        except DataRecordError as e:
            if self.bad_record_policy == "fail":
                raise
            print(f"WARNING: skipping a bad record (--bad-record-policy skip): {e}", flush=True)
            raise SkipSample() from e

    def select_samples_to_pack(self, samples):
        bins, room = [], []
        for sample in samples:
            n = len(sample.sample.tokens)
            if n > self.packing_seq_length:
                raise DataRecordError(f"record {sample.sample.record_id!r}: {n} tokens exceed "
                                      f"--packing-seq-length {self.packing_seq_length}")
            slot = next((i for i, r in enumerate(room) if r >= n), None)
            if slot is None:
                bins.append([])
                room.append(self.packing_seq_length)
                slot = len(bins) - 1
            bins[slot].append(sample)
            room[slot] -= n
        return bins

    @stateless
    def pack_selected_samples(self, samples):
        return PackedSamples.derive_from(samples[0], samples=[s.sample for s in samples])

    def batch(self, samples):
        if self.packing_seq_length is not None:  # one packed sequence per micro-batch
            (packed,) = samples
            return collate_packed(packed.samples, pad_id=self.pad_id)
        return collate([s.sample for s in samples], pad_id=self.pad_id,
                       pad_to_multiple_of=self.pad_to_multiple_of)

    def encode_batch(self, batch):
        return batch


def worker_config(rank: int, world_size: int, num_workers: int, seed: int,
                  data_parallel_group=None) -> WorkerConfig:
    """Energon's per-rank view: this data-parallel rank's share, errors raised (the task
    encoder applies the bad-record policy itself)."""
    return WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers,
                        data_parallel_group=data_parallel_group, seed_offset=seed,
                        global_error_handler=reraise_exception)


def blend_metadataset(paths: list[str], weights: list[float], split: str = "train") -> str:
    """A MetadatasetV2 file blending Energon datasets by weight (Energon's blend); a
    temporary file per process, paths absolute."""
    lines = ["__module__: megatron.energon", "__class__: MetadatasetV2", "splits:",
             f"  {split}:", "    blend:"]
    for path, weight in zip(paths, weights):
        lines += [f"      - weight: {float(weight)!r}", f"        path: {os.path.abspath(path)}"]
    fd, out = tempfile.mkstemp(prefix="megatron_mm_blend_", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    atexit.register(lambda: os.path.exists(out) and os.remove(out))
    return out


@contextlib.contextmanager
def isolated_rng():
    """Energon seeds the global RNGs while it iterates (torch's among them); training's
    RNG streams (dropout, initialisation) must not depend on it, so they are put back."""
    py, np_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(py)
    np.random.set_state(np_state)


class EnergonBatches:
    """Micro-batches from Energon's savable loader, with its state for checkpoints."""

    def __init__(self, loader):
        self.loader = loader
        self._iter = None

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        with isolated_rng():
            if self._iter is None:
                self._iter = iter(self.loader)
            return next(self._iter)

    def save_state(self):
        return self.loader.save_state_rank()

    def restore_state(self, state) -> None:
        self.loader.restore_state_rank(state)

    def close(self) -> None:
        """Stop the loader's worker processes now. Merely dropped, the loader is freed by the
        cycle collector, which runs its queues' finalizers (closing them) before its
        iterator's ``__del__`` puts each worker's stop on them: no worker gets it, and each
        is killed after torch's 5 s join timeout."""
        iterator = getattr(self.loader, "_iterator", None)  # persistent workers keep it
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


def train_batches(path: str, encoder: RecordTaskEncoder, config: WorkerConfig,
                  micro_batch_size: int, state: Optional[dict] = None,
                  packing_buffer_size: Optional[int] = None) -> EnergonBatches:
    """This rank's infinite micro-batches of the ``train`` split (shuffled, repeated),
    resumed from a ``save_state`` if given; packed when ``packing_buffer_size`` is set."""
    with isolated_rng():
        return _train_batches(path, encoder, config, micro_batch_size, state,
                              packing_buffer_size)


def _train_batches(path, encoder, config, micro_batch_size, state, packing_buffer_size):
    if (packing_buffer_size is None) != (encoder.packing_seq_length is None):
        raise ValueError("packing needs both a buffer size and the task encoder's "
                         "packing_seq_length")
    dataset = get_train_dataset(
        path, split_part="train", worker_config=config, batch_size=micro_batch_size,
        batch_drop_last=True, shuffle_buffer_size=SHUFFLE_BUFFER_SIZE,
        max_samples_per_sequence=MAX_SAMPLES_PER_SEQUENCE, task_encoder=encoder,
        packing_buffer_size=packing_buffer_size)
    batches = EnergonBatches(get_savable_loader(dataset))
    if state is not None:
        batches.restore_state(state)
    return batches


def read_records(path: str, split: str, limit: Optional[int] = None) -> list[Record]:
    """The first ``limit`` records of a split in order (validation data: small enough to
    hold as records, media still compressed bytes)."""
    config = WorkerConfig(rank=0, world_size=1, num_workers=0,
                          global_error_handler=reraise_exception)

    class _Records(TaskEncoder):
        decoder = None
        cookers = [Cooker(cook_record)]

        @stateless
        def encode_sample(self, sample):
            return sample.checked()

    records = []
    if limit == 0:
        return records
    with isolated_rng():
        dataset = get_val_dataset(path, split_part=split, worker_config=config,
                                  batch_size=None, task_encoder=_Records())
        for record in get_loader(dataset):
            records.append(record)
            if limit is not None and len(records) >= limit:
                break
    return records

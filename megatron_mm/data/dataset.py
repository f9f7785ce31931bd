"""Map-style dataset over JSONL records and a resumable data-parallel batch sampler."""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Dataset

from .audio import AudioProcessorConfig, check_clip_length, clip_samples
from .media import ImageProcessorConfig
from .processing import Sample, encode_record, tokenize_record
from .jsonl_index import JsonlRecords
from .records import BAD_RECORD_POLICIES, DataRecordError, Record
from .tokenizer import MultimodalTokenizer


# As Energon's default tolerance: this many bad records in a row means the data (or the
# flags) are broken, not a few records.
MAX_CONSECUTIVE_BAD = 100


class MultimodalDataset(Dataset):
    """The records of a JSONL file (indexed lazily, see ``JsonlRecords``) or any sequence
    of ``Record``; each item is validated and encoded when read.

    A bad record (malformed, a media file missing or undecodable, too long) raises
    ``DataRecordError`` naming it under ``bad_record_policy="fail"``; under ``"skip"`` a
    warning names it and the next good record takes its place, so batches stay full and
    the order stays deterministic (a resumed run reads the same substitutes).
    """

    def __init__(self, path: str | os.PathLike | Sequence[Record], tokenizer: MultimodalTokenizer,
                 media_token_counts: dict[str, int], image_cfg: ImageProcessorConfig,
                 max_seq_length: int | None = None,
                 audio_cfg: AudioProcessorConfig | None = None,
                 bad_record_policy: str = "fail", processors: dict | None = None):
        if bad_record_policy not in BAD_RECORD_POLICIES:
            raise ValueError(f"bad_record_policy must be one of {BAD_RECORD_POLICIES}, "
                             f"got {bad_record_policy!r}")
        if isinstance(path, (str, os.PathLike)):
            self.path = os.fspath(path)
            self.records = JsonlRecords(self.path)
        else:
            self.path, self.records = "<records>", path
        self.tokenizer = tokenizer
        self.media_token_counts = dict(media_token_counts)
        self.image_cfg = image_cfg
        self.audio_cfg = audio_cfg
        self.processors = processors  # modality -> media processor; None: the defaults
        self.max_seq_length = max_seq_length
        self.bad_record_policy = bad_record_policy

    def check_audio(self) -> None:
        """Refuse a clip longer than the audio encoder takes, reading every record's WAV
        headers (optional fail-fast; the loader checks each clip when it reads it)."""
        for rec in self.records:
            for ref in rec.media.get("audio", []):
                check_clip_length(clip_samples(ref, self.audio_cfg, rec.where()),
                                  self.audio_cfg, ref, rec.where())

    def __len__(self) -> int:
        return len(self.records)

    def encode(self, idx: int) -> Sample:
        """Record ``idx`` encoded, or DataRecordError naming it."""
        return encode_record(self.records[idx], self.tokenizer, self.media_token_counts,
                             self.image_cfg, self.max_seq_length, self.audio_cfg,
                             self.processors)

    def __getitem__(self, idx: int) -> Sample:
        if self.bad_record_policy == "fail":
            return self.encode(idx)
        for step in range(min(len(self), MAX_CONSECUTIVE_BAD)):
            try:
                return self.encode((idx + step) % len(self))
            except DataRecordError as e:
                print(f"WARNING: skipping a bad record (--bad-record-policy skip): {e}",
                      flush=True)
        raise DataRecordError(f"{self.path}: {min(len(self), MAX_CONSECUTIVE_BAD)} bad "
                              f"records in a row from record {idx} on; the data or the "
                              "flags are broken")

    def check_lengths(self) -> int:
        """Tokenize every record (no image decoding) and raise DataRecordError on the
        first one over max_seq_length; returns the longest length. Optional fail-fast."""
        longest = 0
        for rec in self.records:
            n = len(tokenize_record(rec, self.tokenizer, self.media_token_counts).ids)
            if self.max_seq_length is not None and n > self.max_seq_length:
                raise DataRecordError(f"{rec.where()}: {n} tokens exceed "
                                      f"max_seq_length={self.max_seq_length}")
            longest = max(longest, n)
        return longest


class MegatronPretrainingSampler:
    """Infinite, epoch-based, deterministic batch sampler that resumes exactly.

    Ordering rule: epoch e uses the permutation of range(total_samples) drawn
    from numpy SeedSequence([seed, e]) (identity when shuffle=False), truncated
    to a multiple of `global_batch_size` (default micro_batch_size * dp size;
    the dropped tail differs per epoch). That sequence is cut into consecutive
    chunks of micro_batch_size * data_parallel_size; rank r takes the contiguous
    slice [r * mbs, (r + 1) * mbs) of each chunk. Hence the samples of global
    step k are always positions [k * gbs, (k + 1) * gbs) of the epoch order, no
    matter how gbs splits into dp ranks, micro-batch size and accumulation
    (DP=2/mbs=2 and DP=1/mbs=4 see the same sets). Each sample is used exactly
    once per epoch across all ranks.

    `consumed_samples` is the global number of samples already trained on; a
    new sampler built with it continues exactly where the old one stopped.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, shuffle: bool = True,
                 seed: int = 0, global_batch_size: int | None = None):
        if micro_batch_size < 1 or data_parallel_size < 1:
            raise ValueError("micro_batch_size and data_parallel_size must be >= 1")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(
                f"data_parallel_rank {data_parallel_rank} not in [0, {data_parallel_size})")
        self.chunk = micro_batch_size * data_parallel_size
        gbs = global_batch_size or self.chunk
        if gbs % self.chunk:
            raise ValueError(f"global_batch_size {gbs} is not a multiple of micro_batch_size * "
                             f"data_parallel_size = {self.chunk}")
        self.epoch_len = total_samples // gbs * gbs
        if self.epoch_len == 0:
            raise ValueError(
                f"total_samples={total_samples} is smaller than one global batch ({gbs})")
        if consumed_samples < 0 or consumed_samples % self.chunk:
            raise ValueError(f"consumed_samples={consumed_samples} must be a non-negative multiple "
                             f"of {self.chunk}")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.shuffle = shuffle
        self.seed = seed

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The global sample order of `epoch` (already truncated to epoch_len)."""
        if not self.shuffle:
            return np.arange(self.epoch_len)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        return rng.permutation(self.total_samples)[: self.epoch_len]

    def __iter__(self) -> Iterator[list[int]]:
        # Always starts from the constructor's consumed_samples (the sampler holds no
        # hidden progress): resuming means building a new sampler with the new count.
        epoch, offset = divmod(self.consumed_samples, self.epoch_len)
        lo = self.data_parallel_rank * self.micro_batch_size
        while True:
            order = self.epoch_order(epoch)
            for start in range(offset, self.epoch_len, self.chunk):
                yield order[start + lo: start + lo + self.micro_batch_size].tolist()
            epoch, offset = epoch + 1, 0

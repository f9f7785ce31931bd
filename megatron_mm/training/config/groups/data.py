"""The training and validation data, their tokenizer and loading."""

from dataclasses import dataclass
from typing import List, Literal, Optional

from ....config import ConfigError

from ....data.records import BAD_RECORD_POLICIES
from .fields import flag


@dataclass(frozen=True)
class DataArgs:
    """The training and validation data, their tokenizer and loading."""

    bad_record_policy: str = flag("fail", choices=BAD_RECORD_POLICIES)
    """a record found bad when it is read (malformed, media missing or undecodable, too long): fail
    stops the run naming it; skip warns naming it and reads the next record instead"""
    packing_buffer_size: Optional[int] = None
    """Energon data: pack samples into sequences of --packing-seq-length tokens, choosing from a
    buffer of this many samples (needs --micro-batch-size 1 and --transformer-impl local)"""
    packing_seq_length: Optional[int] = None
    """tokens per packed sequence (default: --seq-length)"""
    data_path: Optional[List[str]] = None
    """a directory with train.jsonl and valid.jsonl, a train .jsonl (then pass --valid-data-path),
    or a Megatron-Energon dataset; a weighted blend as weight-path pairs: 0.7 A 0.3 B. Default:
    the built-in digits data"""
    valid_data_path: Optional[str] = None
    data_cache_path: Optional[str] = None
    """where the built-in dataset is written (default ~/.cache/megatron_mm)"""
    tokenizer_type: Literal["MistralV1SentencePiece", "SentencePiece", "HuggingFaceTokenizer"] = (
        "MistralV1SentencePiece")
    tokenizer_model: Optional[str] = None
    """a SentencePiece .model, or a directory with tokenizer.json"""
    num_workers: int = 0
    data_balance: Literal["none", "isf", "isf-sorted"] = "none"
    """pack training samples into sequences balanced on vision and LLM work across data-parallel
    ranks (OmniBal ISF); isf-sorted also gives each step's ranks groups of matched work.
    --micro-batch-size is then the mean samples per packed micro-batch"""
    data_balance_bounds: str = "auto"
    """auto (searched for the dataset) or Q_v,Q_t[,Q'_v,Q'_t]: images and tokens per packed
    sequence, and when a group counts as full"""
    data_balance_iters: int = 10
    """ISF iterations (re-packing rounds)"""

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag (the data paths':
        ``data_args.validate_data_args``, which needs the model's sequence length)."""
        from ....plan.balance import parse_bounds  # pure Python

        if self.data_balance == "none":
            return []
        try:
            parse_bounds(self.data_balance_bounds)
        except ConfigError as e:  # a PlanError names the flag
            return [e]
        if self.data_balance_iters < 1:
            return [ConfigError("--data-balance-iters must be >= 1")]
        return []

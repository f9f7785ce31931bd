"""Data flags beyond Megatron-LM's ``--data-path`` / ``--num-workers``, and their checks."""

from __future__ import annotations

import argparse

from ...config import ConfigError


def validate_data_args(args: argparse.Namespace) -> None:
    """The data paths exist and are of one kind (JSONL or Energon), with validation data."""
    from ...data.sources import resolve_sources

    sources = resolve_sources(args.data_path, args.valid_data_path) if args.data_path else None
    energon = sources is not None and sources.kind == "energon"
    if energon and args.data_balance != "none":
        raise ConfigError("--data-balance packs samples from a map-style dataset; it does not "
                          "read Energon datasets: use JSONL data or --data-balance none "
                          "(Energon data packs with --packing-buffer-size)")
    if args.packing_seq_length is not None and args.packing_buffer_size is None:
        raise ConfigError("--packing-seq-length needs --packing-buffer-size")
    if args.packing_buffer_size is not None:
        if not energon:
            raise ConfigError("--packing-buffer-size packs Energon data: point --data-path at "
                              "an Energon dataset (tools/jsonl_to_energon.py), or use "
                              "--data-balance with JSONL data")
        if args.packing_buffer_size < 1:
            raise ConfigError("--packing-buffer-size must be positive")
        if args.micro_batch_size != 1:
            raise ConfigError("--packing-buffer-size makes each micro-batch one packed "
                              f"sequence: pass --micro-batch-size 1 (got "
                              f"{args.micro_batch_size})")
        length = args.packing_seq_length or args.seq_length
        if not 0 < length <= args.seq_length:
            raise ConfigError(f"--packing-seq-length {length} must be in [1, --seq-length "
                              f"{args.seq_length}]")

"""Data flags beyond Megatron-LM's ``--data-path`` / ``--num-workers``, and their checks."""

from __future__ import annotations

import argparse

from ..config import ConfigError
from ..data.records import BAD_RECORD_POLICIES


def add_data_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data sources")
    g.add_argument("--bad-record-policy", choices=BAD_RECORD_POLICIES, default="fail",
                   help="a record found bad when it is read (malformed, media missing or "
                        "undecodable, too long): fail stops the run naming it; skip warns "
                        "naming it and reads the next record instead")


def validate_data_args(args: argparse.Namespace) -> None:
    """The data paths exist and are of one kind (JSONL or Energon), with validation data."""
    if args.data_path is None:
        return
    from ..data.sources import resolve_sources

    sources = resolve_sources(args.data_path, args.valid_data_path)
    if sources.kind == "energon" and args.data_balance != "none":
        raise ConfigError("--data-balance packs samples from a map-style dataset; it does not "
                          "read Energon datasets: use JSONL data or --data-balance none")

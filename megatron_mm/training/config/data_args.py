"""Data flags beyond Megatron-LM's ``--data-path`` / ``--num-workers``, and their checks."""

from __future__ import annotations

from ...config import ConfigError


def validate_data_args(config) -> None:
    """The data paths exist and are of one kind (JSONL or Energon), with validation data."""
    from ...data.sources import resolve_sources

    data = config.data
    sources = resolve_sources(data.data_path, data.valid_data_path) if data.data_path else None
    energon = sources is not None and sources.kind == "energon"
    if energon and config.data.data_balance != "none":
        raise ConfigError("--data-balance packs samples from a map-style dataset; it does not "
                          "read Energon datasets: use JSONL data or --data-balance none "
                          "(Energon data packs with --packing-buffer-size)")
    if config.data.packing_seq_length is not None and config.data.packing_buffer_size is None:
        raise ConfigError("--packing-seq-length needs --packing-buffer-size")
    if config.data.packing_buffer_size is not None:
        if not energon:
            raise ConfigError("--packing-buffer-size packs Energon data: point --data-path at "
                              "an Energon dataset (tools/jsonl_to_energon.py), or use "
                              "--data-balance with JSONL data")
        if config.data.packing_buffer_size < 1:
            raise ConfigError("--packing-buffer-size must be positive")
        if config.training.micro_batch_size != 1:
            raise ConfigError("--packing-buffer-size makes each micro-batch one packed "
                              f"sequence: pass --micro-batch-size 1 (got "
                              f"{config.training.micro_batch_size})")
        length = config.data.packing_seq_length or config.model.seq_length
        if not 0 < length <= config.model.seq_length:
            raise ConfigError(f"--packing-seq-length {length} must be in [1, --seq-length "
                              f"{config.model.seq_length}]")

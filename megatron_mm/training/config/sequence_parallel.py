"""``--sequence-parallel`` (Megatron's flag and meaning): its flag, the checks that make it
fail up front. No torch import: flags are checked before any process group exists. The
model side is ``models/sequence_parallel.py``; the padding of the LLM's sequences is
``fp8_args.llm_sequence_multiple`` (one rule with FP8's alignment and CP's factor).

Under sequence parallelism every sequence a transformer stack runs is split over the TP
ranks, so its length must divide by the TP size: the LLM's micro-batches are padded to a
multiple of it (right padding, no loss there; packed micro-batches get a padding sample of
their own); a ViT's patches and class token are padded too (its layers take the padding
as such, on either impl); an audio encoder's frames must divide by it, or the flags are
refused.
"""

from __future__ import annotations

from ...config import ConfigError
from ...families import family_of


def validate_sequence_parallel(config) -> None:
    """After the model config and the encoder schedule flags are known."""
    tp = config.parallel.tensor_model_parallel_size
    if not config.parallel.sequence_parallel:
        return
    if tp == 1:  # Megatron-LM turns it off there (validation.py: already off)
        return
    etp = config.encoder_schedule.encoder_tensor_model_parallel_size
    # the separate placement's encoder ranks run without it and send their output whole
    if etp is not None and etp != tp and config.encoder_schedule.encoder_schedule != "separate":
        raise ConfigError(
            f"--sequence-parallel with --encoder-tensor-model-parallel-size {etp} below "
            f"--tensor-model-parallel-size {tp} is not supported: each encoder replica would "
            "hold only a shard of its output, which the LLM's TP group takes whole; drop one "
            "of the flags")
    cp, block = config.parallel.context_parallel_size, config.parallel.context_parallel_block
    if cp > 1 and block % tp:
        raise ConfigError(
            f"--sequence-parallel with --context-parallel-size {cp} "
            f"needs --context-parallel-block ({block}) to be a "
            f"multiple of --tensor-model-parallel-size ({tp}): each CP rank's tokens are "
            "then split over the TP ranks")
    for name, enc in config.model_config.encoders.items():
        check = family_of(enc).check_sequence_parallel
        if check is not None:
            check(name, enc, tp, config.model.transformer_impl)

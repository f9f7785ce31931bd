"""Megatron-LM's ``train_valid_test_datasets_provider`` for the package's data (JSONL with
media, Energon, the built-in digits data), under ``--dataloader-type external``.

The package's batches are collated by its own collate (padding to the micro-batch's
longest sample, the media of each sample), balanced (``--data-balance``) or read by
Energon's loader, so the provider hands Megatron-LM the iterators themselves, as
Megatron-LM's ``external`` type means: training from ``args.consumed_train_samples`` (a
resumed run continues where the checkpoint stopped) with Megatron-LM's
``MegatronPretrainingSampler`` order per data-parallel rank, validation cycling over its
samples. ``single`` and ``cyclic`` would wrap a dataset in Megatron-LM's own DataLoader,
whose default collate cannot stack samples of different lengths and media: refused with
one error naming the flag.

Every pipeline stage reads its own copy of each micro-batch (the provider is
``is_distributed``: a chunk needs the batch's layout to know the shapes it receives), but
within a stage only the first tensor-parallel rank reads and decodes; the others receive
the collated micro-batch by broadcast over the TP group, as Megatron-LM's ``get_batch``
does, and build no loader (``training/data_setup.py: tensor_parallel_batches``). A stage
whose chunks embed no encoder input is sent the media's shapes, not their pixels.
"""

from __future__ import annotations

from ..config import ConfigError
from ..training.assembly.data_setup import batch_iterator, build_datasets, tensor_parallel_batches
from .context import run_context


def _cycled(make):
    while True:
        yield from make()


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """``(train, valid, test)`` iterators for ``pretrain``: every rank's, read on the
    first TP rank (``vp_stage``: Megatron-LM asks once per virtual stage; each reads the
    same micro-batches)."""
    from megatron.training import get_args

    args = get_args()
    if args.dataloader_type != "external":
        raise ConfigError(
            f"--dataloader-type {args.dataloader_type}: the package's data are batched by "
            "its own collate, balancer or Energon loader: pass --dataloader-type external")
    run = run_context(args)
    train_ds, valid_ds = build_datasets(run.config, run.tokenizer)
    train = tensor_parallel_batches(run.config, run.plan, lambda: batch_iterator(
        run.config, train_ds, run.tokenizer, args.consumed_train_samples, shuffle=True))
    valid = tensor_parallel_batches(run.config, run.plan, lambda: _cycled(
        lambda: batch_iterator(run.config, valid_ds, run.tokenizer, 0, shuffle=False))
    ) if len(valid_ds) else None
    return train, valid, None


train_valid_test_datasets_provider.is_distributed = True

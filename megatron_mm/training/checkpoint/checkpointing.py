"""Megatron-Core distributed checkpoints (``torch_dist``), saved so a crash never spoils one.

Layout, as Megatron-LM writes it::

    <save>/latest_checkpointed_iteration.txt      the last complete iteration
    <save>/iter_0000100/                          .metadata, *.distcp, metadata.json
                                                  (older: common.pt); model_config.json,
                                                  manifest.json (each file's size, CRC-32)

A checkpoint is written into ``iter_XXXXXXX.inprogress`` and renamed into place only after
every rank finished; the tracker file is replaced atomically afterwards. A crash mid-save
therefore leaves the previous checkpoint and the tracker untouched; a save that fails (a
full disk, a missing permission) stops every rank with one message naming the directory
and the error. Weights and optimizer state are resharded on load, so a checkpoint saved at
one TP size loads at another.

Loading checks first (``checkpoint_integrity.py``): a damaged or missing file, or tensors of
another model, stop every rank with one message naming the iteration and the file or
tensors, and the earlier iterations ``--ckpt-step`` can load instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
from contextlib import contextmanager
from dataclasses import asdict
from typing import Callable, List, Optional

import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import (
    ShardedObject, ShardedTensor, ShardedTensorFactory)
from megatron.core.dist_checkpointing.validation import StrictHandling
from torch.distributed.checkpoint.api import CheckpointException

from ...families import SLOTS
from ...models.te_names import is_module_state

from ...data.loaders import save_dataloader_state
from .hf_sidecar import carry_sidecar
from .integrity import (
    checkpoint_files, damaged_files, file_entries, write_manifest)
from .errors import CheckpointError
from .lora import adapters_from

TRACKER = "latest_checkpointed_iteration.txt"
MODEL_CONFIG = "model_config.json"
CHECKPOINT_VERSION = 3.0
# What a checkpoint without content metadata (saved before the flags) holds.
OPTIM_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
_ITERATION = re.compile(r"iter_(\d{7})")


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def read_tracker(root: str) -> Optional[int]:
    path = os.path.join(root, TRACKER)
    if not os.path.isfile(path):
        return None
    text = open(path).read().strip()
    if text == "release":
        return 0
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{path} holds {text!r}, not an iteration number; "
                              f"{way_back(root)}") from None


def saved_iterations(root: str) -> List[int]:
    """The complete iterations under ``root`` (staging and replaced directories left out)."""
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for m in map(_ITERATION.fullmatch, os.listdir(root))
                  if m and os.path.isdir(os.path.join(root, m.group(0))))


def way_back(root: str, iteration: Optional[int] = None) -> str:
    """What to do when iteration ``iteration`` of ``root`` (None: the tracker's, unknown)
    cannot be loaded: the latest iteration before it, else any other."""
    others = [i for i in saved_iterations(root) if i != iteration]
    earlier = [i for i in others if iteration is None or i < iteration]
    if not others:
        return (f"no other iteration is in {root}: restore the checkpoint, or start from "
                f"scratch without --load")
    shown = earlier or others
    listed = ", ".join(map(str, shown[-5:])) + (f" ({len(shown)} in all)"
                                                if len(shown) > 5 else "")
    kind = "earlier iterations" if earlier and iteration is not None else "iterations"
    return f"{kind} in {root}: {listed}; load one with --ckpt-step {shown[-1]}"


def _damaged(root: str, iteration: int, problems: List[str]) -> str:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return (f"--load {root}: iteration {iteration} is damaged: {problems[0]}{more} in "
            f"{iteration_dir(root, iteration)}; {way_back(root, iteration)}")


def _unreadable(root: str, iteration: int, cause: str) -> str:
    return (f"--load {root}: iteration {iteration} could not be read from "
            f"{iteration_dir(root, iteration)} ({cause}); {way_back(root, iteration)}")


def _cause(error: BaseException) -> str:
    """``error``'s root on one line: the first failing rank of a CheckpointException, the
    innermost exception of a chain."""
    if isinstance(error, CheckpointException):
        if not error.failures:
            return "failed on another rank"
        rank, (inner, _) = min(error.failures.items(), key=lambda item: item[0])
        return f"rank {rank}: {_cause(inner)}"
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


# What reading a damaged checkpoint raises, from torch.distributed.checkpoint (its
# CheckpointException is a BaseException), Megatron-Core, torch.load and pickle.
READ_ERRORS = (CheckpointException, CheckpointingException, EOFError, pickle.UnpicklingError,
               OSError, ValueError, RuntimeError, AssertionError)


def saved_args(checkpoint) -> dict:
    """The flags the checkpoint ``--load`` names was saved with ({} for a fresh start);
    ``checkpoint``: the run's checkpointing group. Runs before any process group: the
    files every process reads first are checked by this process alone (``load_checkpoint``
    checks them all)."""
    iteration = locate_checkpoint(checkpoint)
    if iteration is None:
        return {}
    root = checkpoint.load
    path = iteration_dir(root, iteration)
    problems = damaged_files(path, index_only=True)
    if problems:
        raise CheckpointError(_damaged(root, iteration, problems))
    try:
        return _flags_of(dist_checkpointing.load_common_state_dict(path).get("args", {}))
    except READ_ERRORS as e:  # the shard holding them: every file's size names it
        problems = damaged_files(path, checksums=False)
        raise CheckpointError(_damaged(root, iteration, problems) if problems else
                              _unreadable(root, iteration, _cause(e))) from None


def _flags_of(saved) -> dict:
    """A checkpoint's saved flags as a dict: an ``argparse.Namespace`` as Megatron-LM (and
    this package) saves them, or a dict (older checkpoints of this package)."""
    return vars(saved) if isinstance(saved, argparse.Namespace) else dict(saved)


def _rng_state() -> ShardedObject:
    # One entry per rank: dropout streams differ per TP rank and per pipeline stage.
    state = {
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    return ShardedObject("rng_state", state, (world,), (rank,), replica_id=0)


def _model_keys(chunks) -> list:
    # Megatron-LM's names: "model", or "model0", "model1", ... with virtual stages. Tensors
    # are matched by their global names, so layouts with and without chunks interchange.
    return ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]


def optim_metadata(config) -> dict:
    """Megatron-LM's ``_build_sharded_state_dict_metadata`` for the distributed optimizer
    (``config``: the RunConfig): ``dp_reshardable`` (each rank writes its own shard: no
    gather, no host copy of the whole state) unless ``--dist-ckpt-optim-fully-reshardable``
    (gathered over the data-parallel ranks, on every rank unless
    ``--distrib-optim-fully-reshardable-mem-efficient``); saved as the checkpoint's content
    metadata, which the load reads back."""
    if not config.parallel.use_distributed_optimizer:
        return {}
    ckpt = config.checkpoint
    if ckpt.dist_ckpt_optim_fully_reshardable:
        return {"distrib_optim_sharding_type": "fully_reshardable",
                "distrib_optim_fully_reshardable_mem_efficient":
                    ckpt.distrib_optim_fully_reshardable_mem_efficient}
    return {"distrib_optim_sharding_type": "dp_reshardable"}


def _parallel_layout(flags: dict) -> tuple:
    """What a dp_reshardable optimizer state is tied to (Megatron-LM checks TP and PP; the
    encoder ranks of --encoder-schedule separate hold state of their own)."""
    return (flags.get("tensor_model_parallel_size") or 1,
            flags.get("pipeline_model_parallel_size") or 1, _encoder_ranks(flags),
            flags.get("encoder_tensor_model_parallel_size") or 1
            if _encoder_ranks(flags) else None)


def _check_optim_layout(root: str, iteration: int, saved: dict, metadata: dict,
                        config) -> None:
    """A dp_reshardable optimizer state loads at another data-parallel size only (as in
    Megatron-LM's ``load_checkpoint``): elsewhere one error naming the ways out."""
    kind = metadata.get("distrib_optim_sharding_type")
    if kind != "dp_reshardable":
        return
    then, now = _parallel_layout(saved), _parallel_layout(config.flags())
    if then == now and config.parallel.use_distributed_optimizer:
        return
    here = (f"(TP, PP) = {now[:2]}" + (f" with {now[2]} encoder ranks" if now[2] else "")
            + ("" if config.parallel.use_distributed_optimizer
               else " without --use-distributed-optimizer"))
    raise CheckpointError(
        f"--load {root}: iteration {iteration}'s distributed-optimizer state is "
        f"dp_reshardable, saved at (TP, PP) = {then[:2]}"
        + (f" with {then[2]} encoder ranks" if then[2] else "")
        + f"; this run has {here}: it loads at another data-parallel size only. Load the "
        f"model alone with --no-load-optim, or save with --dist-ckpt-optim-fully-reshardable "
        f"to reshard the optimizer across TP/PP")


# A dp_reshardable optimizer state is stored in DDP bucket space: each bucket's parameters
# in order, flattened. What orders and groups them besides TP and PP: the layers on each
# pipeline stage (--pipeline-partition; a search picks by timing), the virtual stages, the
# trainable set (the --freeze-* flags, LoRA), the bucket size and overlap, expert
# parallelism. The save records every (PP, TP, EP) rank's layout (a digest of its buckets'
# parameter names and shapes); the load compares its own.
BUCKET_LAYOUT = "optimizer_bucket_layout"
LAYOUT_FLAGS = ("virtual_pipeline_model_parallel_size", "pipeline_partition",
                "overlap_grad_reduce", "expert_model_parallel_size",
                "expert_tensor_parallel_size", "freeze_LM", "freeze_ViT", "freeze_audio",
                "freeze_projector", "lora_rank", "lora_target_modules")


def _bucket_layout(chunks, optimizer) -> Optional[str]:
    """A digest of this rank's DDP buckets (the distributed optimizer's buffers): each
    bucket's parameters, by name in their chunk and shape, in order; None without them."""
    optimizers = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    buffers = [b for o in optimizers for b in (getattr(o, "buffers", None) or [])]
    if not buffers:
        return None
    names = {id(p): f"{i}.{n}" for i, chunk in enumerate(chunks)
             for n, p in chunk.named_parameters()}
    layout = [[[(names.get(id(p), "?"), tuple(p.shape)) for p in bucket.params_list]
               for bucket in buffer.buckets] for buffer in buffers]
    return hashlib.sha256(repr(layout).encode()).hexdigest()[:16]


def _bucket_layouts(chunks, optimizer) -> list:
    """[PP rank, TP rank, EP rank, digest] of every such rank (data-parallel replicas hold
    the same buckets); a collective."""
    mine = (parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_expert_model_parallel_rank(), _bucket_layout(chunks, optimizer))
    return [list(x) for x in sorted(set(_everyone(mine)), key=str)]


def _check_bucket_layout(root: str, iteration: int, saved: dict, chunks, optimizer, config,
                         run_state: Optional[dict]) -> None:
    """A dp_reshardable state loads only into the same DDP buckets: elsewhere one error
    naming what changed and the ways out (not a shape error deep in the load, nor Adam
    moments on other parameters where the sizes happen to match)."""
    then = saved.get(BUCKET_LAYOUT)
    if then is None:  # saved before the layout was recorded
        return
    now = _bucket_layouts(chunks, optimizer)
    if sorted(map(tuple, then), key=str) == sorted(map(tuple, now), key=str):
        return
    flags = config.flags()
    changed = [f"--{k.replace('_', '-')} {saved.get(k)} -> {flags.get(k)}"
               for k in LAYOUT_FLAGS if saved.get(k) != flags.get(k)]
    old_plan = (saved.get("pipeline_plan") or {}).get("layers_per_chunk")
    new_plan = ((run_state or {}).get("pipeline_plan") or {}).get("layers_per_chunk")
    if old_plan is not None and new_plan is not None and old_plan != new_plan:
        changed.insert(0, f"the pipeline partition (layers per chunk) {old_plan} -> {new_plan}")
    raise CheckpointError(
        f"--load {root}: iteration {iteration}'s distributed-optimizer state is "
        f"dp_reshardable, stored in the DDP buckets of the run that saved it, and this "
        f"run's buckets differ ({'; '.join(changed) or 'the trainable parameters or their order'}"
        f"): it loads into the same buckets only. Load the model alone with --no-load-optim, "
        f"or save with --dist-ckpt-optim-fully-reshardable to reshard the optimizer")


def saved_pipeline_plan(checkpoint, parallel) -> Optional[List[int]]:
    """The layers per chunk the checkpoint ``--load`` names was trained with, where it
    has them for this run's pipeline (PP x VPP chunks) and its optimizer state is loaded;
    None otherwise. A resumed ``--pipeline-partition search`` keeps them: its pick is
    timing-based, so a search re-run may cut elsewhere, and the dp_reshardable optimizer
    state is tied to the cut."""
    if not checkpoint.load or checkpoint.no_load_optim or checkpoint.finetune:
        return None  # no optimizer state to keep the cut for: a search may pick anew
    try:
        saved = saved_args(checkpoint)
    except CheckpointError:
        return None  # the load reports it
    layers = (saved.get("pipeline_plan") or {}).get("layers_per_chunk")
    chunks = (parallel.pipeline_model_parallel_size
              * (parallel.virtual_pipeline_model_parallel_size or 1))
    same = all(saved.get(k) == getattr(parallel, k) for k in
               ("pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"))
    return list(layers) if layers and same and len(layers) == chunks else None


def _state_dict(chunks, optimizer, scheduler, config, iteration: int, with_optim: bool,
                with_rng: bool, loading: bool, run_state: Optional[dict] = None,
                metadata: Optional[dict] = None) -> dict:
    model_sd = {key: chunk.sharded_state_dict()
                for key, chunk in zip(_model_keys(chunks), chunks)}
    state = {**model_sd, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
    if with_optim:
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=loading,
            metadata=OPTIM_METADATA if metadata is None else metadata)
        state["opt_param_scheduler"] = scheduler.state_dict()
        if not loading:
            _share_common_step(state["optimizer"])
    if with_rng:
        state["rng_state"] = _rng_state()
    if not loading:
        flags = {k: v for k, v in config.flags().items() if _plain(v)}
        flags["consumed_train_samples"] = iteration * config.training.global_batch_size
        # What the run derived (the padded vocabulary, its pipeline plan), kept with the
        # flags as Megatron-LM keeps padded_vocab_size there.
        flags.update(run_state or {})
        if with_optim and (metadata or {}).get("distrib_optim_sharding_type") == \
                "dp_reshardable":
            flags[BUCKET_LAYOUT] = _bucket_layouts(chunks, optimizer)
        # As Megatron-LM saves them (its load_checkpoint reads them as attributes:
        # check_checkpoint_args, consumed_train_samples), so it loads these checkpoints
        # without --finetune
        state["args"] = argparse.Namespace(**flags)
    return state


def _share_common_step(optimizer_state: dict) -> None:
    """Megatron-Core saves the optimizer's step (``common_step``) in the common state,
    which rank 0 writes. A rank 0 that trains nothing (the frozen encoder's rank of
    ``--encoder-schedule separate``) has no step: it writes the ranks' step instead
    (a collective: every rank saving calls it)."""
    own = optimizer_state.get("state", {}).get("common_step")
    steps = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(steps, own)
    if own is None and "state" in optimizer_state:
        step = next((s for s in steps if s is not None), None)
        if step is not None:
            optimizer_state["state"]["common_step"] = step


def _encoder_ranks(flags: dict) -> int:
    """The world's ranks beside the LLM's: the encoder ranks of --encoder-schedule
    separate (``flags``: Megatron-LM's names, as checkpoints save them)."""
    if flags.get("encoder_schedule") != "separate":
        return 0
    own = [flags.get(f"{slot}_encoder_data_parallel_size") or 0 for slot in SLOTS]
    return ((flags.get("encoder_tensor_model_parallel_size") or 1)
            * (sum(own) or flags.get("encoder_data_parallel_size") or 1))


def _plain(value) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), list, tuple))


def save_checkpoint(config, iteration: int, chunks, optimizer, scheduler,
                    model_config=None, run_state: Optional[dict] = None,
                    data_iterator=None) -> str:
    """Save iteration ``iteration`` of the model chunks (unwrapped) and their optimizer, and
    the state of ``data_iterator`` (Energon's loader) where one is given; the flags of
    ``config`` (the RunConfig) go with them, under Megatron-LM's names.
    ``model_config``: the model's (default the flags'); ``run_state``: values the run
    derived, saved with the flags.

    Each step that can fail on some ranks only (a full disk, a missing permission) ends
    where every rank learns how it went, in place of a barrier: a failure stops every rank
    with one CheckpointError, and none waits in a later collective."""
    root = config.checkpoint.save
    final = iteration_dir(root, iteration)
    staging = final + ".inprogress"
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()

    def agree(error: Optional[str], specific: bool = True) -> None:
        errors = [(e, s) for e, s in _everyone((error, specific)) if e]
        if errors:
            if rank == 0:  # what the failed save wrote, out of a full disk's way
                shutil.rmtree(staging, ignore_errors=True)
            error = min(errors, key=lambda e: not e[1])[0]  # a rank's own error first
            raise CheckpointError(
                f"saving iteration {iteration} to {final} failed: {error}; the earlier "
                f"checkpoints in {root} and its {TRACKER} are as they were (free space or "
                f"fix the permission, then resume with --load {root})")

    agree(_attempt(_prepare_staging, root, staging, config.checkpoint.load)[1]
          if rank == 0 else None)
    # --no-save-optim / --no-save-rng: weights only (converted checkpoints are).
    metadata = optim_metadata(config)
    state = _state_dict(chunks, optimizer, scheduler, config, iteration,
                        with_optim=not config.checkpoint.no_save_optim,
                        with_rng=not config.checkpoint.no_save_rng, loading=False,
                        run_state=run_state, metadata=metadata)
    with _writer_errors() as logged:
        error = _attempt(dist_checkpointing.save, state, staging, async_sharded_save=False,
                         content_metadata=metadata)[1]
    # A rank whose own writer failed names the error; the others only learn that one did.
    specific = bool(error and logged)
    if specific:
        error = f"rank {rank}: {logged[0]}"
    if error is None and data_iterator is not None and _first_of_model_parallel_group():
        error = _attempt(save_dataloader_state, data_iterator, staging,
                         parallel_state.get_data_parallel_rank(),
                         errors=SAVE_ERRORS + (RuntimeError,))[1]  # torch.save's full disk
        specific, error = error is not None, error and f"rank {rank}: {error}"
    agree(error, specific)
    listing, error = (_attempt(_complete_staging, staging, model_config or config.model_config)
                      if rank == 0 else (None, None))
    listing, error = _everyone((listing, error))[0]
    agree(error)
    entries, error = _attempt(file_entries, staging, listing[rank::world])
    gathered = _everyone((entries, error))
    agree(next((e for _, e in gathered if e), None))
    if rank == 0:
        entries = {name: entry for part, _ in gathered for name, entry in part.items()}
        error = _attempt(_publish, root, staging, final, iteration, entries)[1]
    agree(error)
    return final


# What a failed write raises: torch.distributed.checkpoint's CheckpointException (every
# rank, once its writers are done), an OSError of a step of this module's.
SAVE_ERRORS = (CheckpointException, OSError)


def _attempt(fn: Callable, *args, errors: tuple = SAVE_ERRORS, **kwargs):
    """``fn(*args, **kwargs)`` and None, or None and the error it raised, on one line."""
    try:
        return fn(*args, **kwargs), None
    except errors as e:
        return None, _cause(e)


def _everyone(value) -> list:
    """``value`` of every rank, on every rank."""
    values = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(values, value)
    return values


@contextmanager
def _writer_errors():
    """Megatron-Core's writer threads report a failed write (no space, no permission) only
    in a log record; the exception they pass on says ``<class 'OSError'>``. Yields the
    records' errors, kept out of the log: the one-line error names them."""
    logger = logging.getLogger("megatron.core.dist_checkpointing.strategies.filesystem_async")
    found: List[str] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        found.append(record.getMessage().split("error: ", 1)[-1])
        return False

    logger.addFilter(keep)
    try:
        yield found
    finally:
        logger.removeFilter(keep)


def _prepare_staging(root: str, staging: str, load: Optional[str] = None) -> None:
    os.makedirs(root, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)  # leftovers of a crashed save
    os.makedirs(staging)
    carry_sidecar(load, root)  # --load A --save B: export reads B's hf/ too


def _complete_staging(staging: str, model_config) -> List[str]:
    """Writes the model config beside the shards; returns every file the manifest will
    list."""
    with open(os.path.join(staging, MODEL_CONFIG), "w") as f:
        json.dump(asdict(model_config), f, indent=1, default=sorted)
    return checkpoint_files(staging)


def _publish(root: str, staging: str, final: str, iteration: int, entries: dict) -> None:
    """The manifest written, the staging directory renamed into place, the tracker
    replaced: until the rename, ``root`` is as it was."""
    write_manifest(staging, iteration, entries)
    if os.path.exists(final):  # re-saving an iteration: keep the old one until done
        shutil.rmtree(final + ".old", ignore_errors=True)
        os.rename(final, final + ".old")
        try:
            os.rename(staging, final)
        except OSError:
            os.rename(final + ".old", final)
            raise
    else:
        os.rename(staging, final)
    shutil.rmtree(final + ".old", ignore_errors=True)
    tmp = os.path.join(root, TRACKER + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, TRACKER))


def _first_of_model_parallel_group() -> bool:
    # Its model-parallel peers read the same samples: one file per data-parallel rank.
    return (parallel_state.get_tensor_model_parallel_rank() == 0
            and parallel_state.get_pipeline_model_parallel_rank() == 0
            and parallel_state.get_context_parallel_rank() == 0)


def locate_checkpoint(checkpoint) -> Optional[int]:
    """The iteration ``--load`` resumes from: ``--ckpt-step`` where given (Megatron-LM's:
    a nonzero step replaces the tracker's iteration), else the tracker's; None for a fresh
    auto-resume directory.

    A ``--load`` directory without a checkpoint is an error, except when it is also the
    ``--save`` directory (auto-resume: the first run starts from scratch).
    """
    root = checkpoint.load
    step = checkpoint.ckpt_step
    iteration = step or (read_tracker(root) if os.path.isdir(root) else None)
    if iteration is None:
        if checkpoint.save and os.path.abspath(checkpoint.save) == os.path.abspath(root):
            return None
        found = sorted(os.listdir(root)) if os.path.isdir(root) else None
        raise CheckpointError(
            f"--load {root}: no checkpoint found ("
            + ("the directory does not exist" if found is None else
               f"no {TRACKER}; it contains {found[:5] or 'nothing'}")
            + "). Point --load at a directory written by --save, or drop --load to start "
              "from scratch.")
    if not os.path.isdir(iteration_dir(root, iteration)):
        named = f"--ckpt-step {step}" if step else f"{TRACKER} in {root}"
        raise CheckpointError(f"{named} names iteration {iteration} but "
                              f"{iteration_dir(root, iteration)} is missing; "
                              f"{way_back(root, iteration)}")
    return iteration


def _model_mismatches(template: dict, keys: List[str], path: str) -> List[tuple]:
    """(name, its shape in the checkpoint or None where it lacks it, its shape in the
    model) for the model's tensors (``template``'s ``keys``) that the checkpoint at
    ``path`` lacks or holds at another shape: its index is read, no tensor."""
    saved = dist_checkpointing.load_tensors_metadata(path)
    out = []
    for sharded in _sharded_tensors([template[key] for key in keys]):
        there = saved.get(sharded.key)
        here = list(sharded.global_shape)
        if there is None and not is_module_state(sharded.key):
            out.append((sharded.key, None, here))
        elif (there is not None and list(there.global_shape) != here
              and not sharded.allow_shape_mismatch):
            out.append((sharded.key, list(there.global_shape), here))
    return out


def _sharded_tensors(state):
    for value in nested_values(state):
        if isinstance(value, ShardedTensorFactory):
            yield from _sharded_tensors(value.build())
        elif isinstance(value, ShardedTensor):
            yield value


def _another_model(root: str, iteration: int, mismatches: List[tuple]) -> str:
    shapes = [f"{name} is {there} there, {here} in this model"
              for name, there, here in mismatches if there is not None]
    absent = [name for name, there, _ in mismatches if there is None]
    parts = ([f"{len(shapes)} tensors differ in shape, e.g. " + "; ".join(shapes[:3])]
             if shapes else [])
    if absent:
        parts.append(f"it lacks {len(absent)} tensors the model needs, e.g. {absent[:3]}")
    return (f"--load {root}: iteration {iteration} is a checkpoint of another model: "
            + "; ".join(parts) + f" (the flags it was saved with: {MODEL_CONFIG} in "
            f"{iteration_dir(root, iteration)})")


def _agreed(problems: list) -> list:
    """Every rank's problems, in rank order without repeats, on every rank: pipeline
    stages hold different tensors, and all must stop if one does."""
    out: list = []
    for part in _everyone(problems):
        out.extend(p for p in part if p not in out)
    return out


def _load_allowing_absent_module_state(template: dict, path: str):
    """Load ``template`` from ``path``; tensors the template asks for and the checkpoint
    lacks (Megatron-Core's "unexpected" keys) may only be TE's ``_extra_state`` (a checkpoint
    saved with ``--transformer-impl local`` loaded into TE layers)."""
    state, _, absent = dist_checkpointing.load(template, path,
                                               strict=StrictHandling.RETURN_UNEXPECTED)
    weights = sorted(k for k in absent if not is_module_state(k.split("/")[0]))
    if weights:
        raise CheckpointError(f"{path} lacks {len(weights)} tensors the model needs, e.g. "
                              f"{weights[:5]}: a checkpoint of another model?")
    return state


def holds_optimizer_state(path: str) -> bool:
    """Whether the checkpoint at ``path`` has optimizer tensors: one saved before the first
    step (``--train-iters 0``; Adam creates its moments on the first step) or with
    ``--no-save-optim`` has none."""
    return any(key.startswith("optimizer.")
               for key in dist_checkpointing.load_tensors_metadata(path))


def _load_model(template: dict, path: str, chunks) -> dict:
    """The checkpoint's state for ``template``, the model chunks loaded from it."""
    state = _load_allowing_absent_module_state(template, path)
    for key, chunk in zip(_model_keys(chunks), chunks):
        # Only TE's _extra_state may be missing (Megatron-LM falls back to strict=False
        # for it too): TEDotProductAttention has one but checkpoints none, and a checkpoint
        # saved with local specs has none. The module keeps its own.
        result = chunk.load_state_dict(state[key], strict=False)
        missing = [k for k in result.missing_keys if not is_module_state(k)]
        if missing or result.unexpected_keys:
            raise CheckpointError(f"{path}: the model and the checkpoint differ: missing "
                                  f"{missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    return state


def load_checkpoint(config, chunks, optimizer, scheduler, log=print,
                    run_state: Optional[dict] = None) -> int:
    """Load the checkpoint ``--load`` / ``--ckpt-step`` name (``config``: the RunConfig);
    returns the iteration to resume at. ``run_state``: what this run derived (its
    pipeline plan), to name a changed partition."""
    ckpt = config.checkpoint
    iteration = locate_checkpoint(ckpt)
    if iteration is None:
        return 0
    root = ckpt.load
    path = iteration_dir(root, iteration)
    # Checked before anything is read, the same verdict on every rank: its files (the
    # ranks share the checksums), then its tensors' names and shapes against the model's.
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    problems = _agreed(damaged_files(path, (rank, world)))
    if problems:
        raise CheckpointError(_damaged(root, iteration, problems))
    saved = saved_args(ckpt)
    # the RNG states are one per rank of the world: the encoder ranks of --encoder-schedule
    # separate count too (world_size is the LLM's)
    same_layout = all(saved.get(k) == getattr(config.parallel, k) for k in
                      ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                       "world_size")) and _encoder_ranks(saved) == _encoder_ranks(
                          config.flags())
    # no optimizer (compare, export): the model's weights alone, whatever the checkpoint holds
    with_optim = optimizer is not None and not (
        ckpt.no_load_optim or ckpt.finetune or saved.get("no_save_optim"))
    if with_optim and not holds_optimizer_state(path):
        with_optim = False
        log(f" > {path} holds no optimizer state (saved before the first optimizer step, "
            f"or with --no-save-optim): loading the model weights only; the optimizer and "
            f"learning-rate schedule start fresh")
    with_rng = (not (ckpt.no_load_rng or ckpt.finetune or saved.get("no_save_rng"))
                and same_layout)
    # the optimizer state as it was saved (Megatron-LM reads the content metadata too)
    metadata = dist_checkpointing.load_content_metadata(path) or OPTIM_METADATA
    if with_optim:
        _check_optim_layout(root, iteration, saved, metadata, config)
    adapters_from(path, chunks, with_optim, log)  # LoRA adapters it lacks start fresh
    template = _state_dict(chunks, optimizer, scheduler, config, iteration, with_optim,
                           with_rng, loading=True, metadata=metadata)
    mismatches = _agreed(_model_mismatches(template, _model_keys(chunks), path))
    if mismatches:
        raise CheckpointError(_another_model(root, iteration, mismatches))
    if with_optim and metadata.get("distrib_optim_sharding_type") == "dp_reshardable":
        # the same model, in other buckets
        _check_bucket_layout(root, iteration, saved, chunks, optimizer, config, run_state)
    # What the checks cannot see (a shard damaged inside, in a checkpoint without a
    # manifest) fails on the ranks that read it: all stop, with its cause.
    try:
        state, error = _load_model(template, path, chunks), None
    except CheckpointError as e:
        error = str(e)
    except READ_ERRORS as e:
        error = _unreadable(root, iteration, _cause(e))
    error = next((e for e in _everyone(error) if e), None)
    if error:
        raise CheckpointError(error)
    if with_optim:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["opt_param_scheduler"])
    elif optimizer is not None:
        # As Megatron-LM: the bf16 optimizer's fp32 main params were copied from the
        # model's initial weights; without this the first step would undo the load.
        optimizer.reload_model_params()
    if with_rng:
        rng = state["rng_state"]
        torch.set_rng_state(rng["torch"])
        tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return 0 if ckpt.finetune else iteration


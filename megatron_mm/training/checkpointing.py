"""Megatron-Core distributed checkpoints (``torch_dist``), saved so a crash never spoils one.

Layout, as Megatron-LM writes it::

    <save>/latest_checkpointed_iteration.txt      the last complete iteration
    <save>/iter_0000100/                          .metadata, *.distcp, common.pt, metadata.json

A checkpoint is written into ``iter_XXXXXXX.inprogress`` and renamed into place only after
every rank finished; the tracker file is replaced atomically afterwards. A crash mid-save
therefore leaves the previous checkpoint and the tracker untouched. Weights and optimizer
state are resharded on load, so a checkpoint saved at one TP size loads at another.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from typing import Optional

import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.validation import StrictHandling

from ..models.te_names import is_module_state

from ..data.loaders import save_dataloader_state

TRACKER = "latest_checkpointed_iteration.txt"
MODEL_CONFIG = "model_config.json"
CHECKPOINT_VERSION = 3.0
# Reshardable across TP/DP changes (the deprecated default cannot be loaded at all).
OPTIM_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


class CheckpointError(RuntimeError):
    pass


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
        raise CheckpointError(f"{path} holds {text!r}, not an iteration number") from None


def saved_args(checkpoint) -> dict:
    """The flags the checkpoint ``--load`` names was saved with ({} for a fresh start);
    ``checkpoint``: the run's checkpointing group."""
    iteration = locate_checkpoint(checkpoint)
    if iteration is None:
        return {}
    path = iteration_dir(checkpoint.load, iteration)
    return dist_checkpointing.load_common_state_dict(path).get("args", {})


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


def _state_dict(chunks, optimizer, scheduler, config, iteration: int, with_optim: bool,
                with_rng: bool, loading: bool, run_state: Optional[dict] = None) -> dict:
    model_sd = {key: chunk.sharded_state_dict()
                for key, chunk in zip(_model_keys(chunks), chunks)}
    state = {**model_sd, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
    if with_optim:
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=loading, metadata=OPTIM_METADATA)
        state["opt_param_scheduler"] = scheduler.state_dict()
    if with_rng:
        state["rng_state"] = _rng_state()
    if not loading:
        state["args"] = {k: v for k, v in config.flags().items() if _plain(v)}
        state["args"]["consumed_train_samples"] = (iteration
                                                   * config.training.global_batch_size)
        # What the run derived (the padded vocabulary, its pipeline plan), kept with the
        # flags as Megatron-LM keeps padded_vocab_size there.
        state["args"].update(run_state or {})
    return state


def _plain(value) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), list, tuple))


def save_checkpoint(config, iteration: int, chunks, optimizer, scheduler,
                    model_config=None, run_state: Optional[dict] = None,
                    data_iterator=None) -> str:
    """Save iteration ``iteration`` of the model chunks (unwrapped) and their optimizer, and
    the state of ``data_iterator`` (Energon's loader) where one is given; the flags of
    ``config`` (the RunConfig) go with them, under Megatron-LM's names.
    ``model_config``: the model's (default the flags'); ``run_state``: values the run
    derived, saved with the flags."""
    root = config.checkpoint.save
    final = iteration_dir(root, iteration)
    staging = final + ".inprogress"
    rank0 = torch.distributed.get_rank() == 0
    if rank0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # leftovers of a crashed save
        os.makedirs(staging)
    torch.distributed.barrier()
    # --no-save-optim / --no-save-rng: weights only (converted checkpoints are).
    state = _state_dict(chunks, optimizer, scheduler, config, iteration,
                        with_optim=not config.checkpoint.no_save_optim,
                        with_rng=not config.checkpoint.no_save_rng, loading=False,
                        run_state=run_state)
    dist_checkpointing.save(state, staging, async_sharded_save=False)
    if data_iterator is not None and _first_of_model_parallel_group():
        save_dataloader_state(data_iterator, staging, parallel_state.get_data_parallel_rank())
    torch.distributed.barrier()
    if rank0:
        with open(os.path.join(staging, MODEL_CONFIG), "w") as f:
            json.dump(asdict(model_config or config.model_config), f, indent=1,
                      default=sorted)
        if os.path.exists(final):  # re-saving an iteration: keep the old one until done
            shutil.rmtree(final + ".old", ignore_errors=True)
            os.rename(final, final + ".old")
        os.rename(staging, final)
        shutil.rmtree(final + ".old", ignore_errors=True)
        tmp = os.path.join(root, TRACKER + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(iteration))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, TRACKER))
    torch.distributed.barrier()
    return final


def _first_of_model_parallel_group() -> bool:
    # Its model-parallel peers read the same samples: one file per data-parallel rank.
    return (parallel_state.get_tensor_model_parallel_rank() == 0
            and parallel_state.get_pipeline_model_parallel_rank() == 0
            and parallel_state.get_context_parallel_rank() == 0)


def locate_checkpoint(checkpoint) -> Optional[int]:
    """The iteration ``--load`` resumes from; None for a fresh auto-resume directory.

    A ``--load`` directory without a checkpoint is an error, except when it is also the
    ``--save`` directory (auto-resume: the first run starts from scratch).
    """
    root = checkpoint.load
    iteration = read_tracker(root) if os.path.isdir(root) else None
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
        raise CheckpointError(f"{TRACKER} in {root} names iteration {iteration} but "
                              f"{iteration_dir(root, iteration)} is missing")
    return iteration


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


def load_checkpoint(config, chunks, optimizer, scheduler, log=print) -> int:
    """Load the latest checkpoint under ``--load`` (``config``: the RunConfig); returns the
    iteration to resume at."""
    ckpt = config.checkpoint
    iteration = locate_checkpoint(ckpt)
    if iteration is None:
        return 0
    root = ckpt.load
    path = iteration_dir(root, iteration)
    saved = saved_args(ckpt)
    same_layout = all(saved.get(k) == getattr(config.parallel, k) for k in
                      ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                       "world_size"))
    with_optim = not (ckpt.no_load_optim or ckpt.finetune or saved.get("no_save_optim"))
    if with_optim and not holds_optimizer_state(path):
        with_optim = False
        log(f" > {path} holds no optimizer state (saved before the first optimizer step, "
            f"or with --no-save-optim): loading the model weights only; the optimizer and "
            f"learning-rate schedule start fresh")
    with_rng = (not (ckpt.no_load_rng or ckpt.finetune or saved.get("no_save_rng"))
                and same_layout)
    template = _state_dict(chunks, optimizer, scheduler, config, iteration, with_optim,
                           with_rng, loading=True)
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


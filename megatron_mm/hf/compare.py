"""A converted checkpoint against its Hugging Face model: both run the same forward
keyword arguments in fp32 and the largest absolute logit difference comes back.

The Hugging Face model runs in this process; the megatron_mm model is loaded from the
distributed checkpoint the way the training script loads it (``--load`` alone decides the
architecture) at the requested TP / PP, in as many processes as those need (started here:
gloo on the CPU, NCCL on GPUs). ``tools/convert_hf.py compare`` is the command line; the
tests use the same functions.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
import traceback
from typing import Dict, Optional, Tuple

import torch

from .convert import media_token_ids
from .errors import ConversionError
from .families import Family, family_for

ATTENTION_MASK = "attention_mask"


# ---------------------------------------------------------------- inputs

def check_inputs(family: Family, inputs: Dict[str, torch.Tensor]) -> None:
    """Refuse keyword arguments the family's megatron_mm model does not take."""
    if not isinstance(inputs, dict):
        raise ConversionError(f"--inputs must hold a dict of the Hugging Face forward's "
                              f"keyword arguments, not a {type(inputs).__name__}")
    for key in inputs:
        if key not in family.inputs:
            raise ConversionError(f"--inputs key {key!r} is not an input of {family.architecture}"
                                  f" here; accepted: {', '.join(family.inputs)}")
    if "input_ids" not in inputs:
        raise ConversionError("--inputs has no 'input_ids'")
    mask = inputs.get(ATTENTION_MASK)
    if mask is not None and not bool((mask == 1).all()):
        raise ConversionError("--inputs key 'attention_mask' has zeros (padding): the "
                              "megatron_mm model runs unpadded sequences; give each "
                              "sequence at its own length")
    pixels = inputs.get("pixel_values")
    if family.media is None and pixels is not None and pixels.dim() != 4:
        raise ConversionError(f"--inputs key 'pixel_values' has shape {tuple(pixels.shape)};"
                              f" expected [images, channels, height, width] (InternVL: "
                              f"every image's tiles)")


def megatron_media(inputs: Dict[str, torch.Tensor]) -> Optional[Dict[str, torch.Tensor]]:
    """The megatron_mm model's media dict for the Hugging Face forward's arguments."""
    media = {}
    if "pixel_values" in inputs:
        media["image"] = inputs["pixel_values"].float()
    if "input_features" in inputs:
        mels = inputs["input_features"].float()
        frames = inputs.get("feature_attention_mask")
        media["audio"] = mels
        media["audio_frames"] = (frames.sum(-1) if frames is not None
                                 else torch.full((mels.shape[0],), mels.shape[-1]))
    return media or None


@torch.no_grad()
def hf_logits(model, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The Hugging Face model's logits on ``inputs``."""
    if type(model).__name__.startswith("LlavaOnevision") and "pixel_values" in inputs:
        # Its forward always tiles (any resolution); one tile is the encoder, projector
        # and language model of the same Hugging Face model, composed as its forward does.
        cfg, inner, tokens = model.config, model.model, inputs["input_ids"]
        hidden = inner.vision_tower(inputs["pixel_values"], output_hidden_states=True)
        features = inner.multi_modal_projector(hidden.hidden_states[cfg.vision_feature_layer])
        embeds = inner.get_input_embeddings()(tokens)
        embeds = embeds.masked_scatter((tokens == cfg.image_token_id)[..., None],
                                       features.to(embeds.dtype))
        out = inner.language_model(inputs_embeds=embeds).last_hidden_state
        return model.lm_head(out)
    return model(**inputs).logits


def load_hf(hf_dir: str, family: Family):
    import transformers

    transformers.utils.logging.disable_progress_bar()  # the last line is the result
    return getattr(transformers, family.architecture).from_pretrained(
        hf_dir, dtype=torch.float32).eval()


# ---------------------------------------------------------------- megatron_mm side

def checkpoint_run_config(ckpt: str, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1,
                          cp_block: Optional[int] = None):
    """The training script's RunConfig for ``--load ckpt`` at TP / PP / EP (expert
    parallelism: an MoE LLM's) / CP (blocks of ``cp_block`` tokens; ConfigError on a
    layout the checkpoint cannot take)."""
    from ..training.config.values import checkpoint_values, run_config_of

    # the model's weights only: a trained checkpoint's optimizer state and RNG stay unread
    values = {"load": ckpt, "tensor_model_parallel_size": tp,
              "pipeline_model_parallel_size": pp, "no_load_optim": True, "no_load_rng": True}
    if ep != 1:  # a dense checkpoint refuses it, naming the flag
        values["expert_model_parallel_size"] = ep
    values["context_parallel_size"] = cp
    if cp_block is not None:
        values["context_parallel_block"] = cp_block
    saved = checkpoint_values(ckpt, values)
    model = run_config_of(values, saved).flags()
    if model["max_position_embeddings"]:  # no training: any length the model takes
        values["seq_length"] = model["max_position_embeddings"]
    if model["num_experts"] is not None:  # an MoE LLM: what every layout takes
        values["moe_token_dispatcher_type"] = "alltoall"
        values["sequence_parallel"] = tp > 1  # Megatron-Core's MoE layers need it at TP > 1
        values["expert_tensor_parallel_size"] = expert_tensor_parallel_size(tp, ep)
        if values["sequence_parallel"]:  # the padded encoder shards' mask: local attention
            values["transformer_impl"] = "local"
    return run_config_of(values, saved).validated(world_size(tp, pp, ep, cp))


def expert_tensor_parallel_size(tp: int, ep: int) -> int:
    """The experts' TP of a comparison: the TP size, or 1 with EP > 1 (each expert whole
    on its TP ranks), as with ETP = TP the all-to-all dispatcher all-gathers the TP ranks'
    tokens routed to an expert, uneven sizes that gloo's all-gather does not take."""
    return tp if ep == 1 else 1


def world_size(tp: int, pp: int, ep: int, cp: int = 1) -> int:
    """Ranks of a comparison at TP / PP / EP / CP: the experts' grid (ETP x EP x PP x
    expert DP) over the dense one (TP x CP x PP x DP), each data-parallel rank running the
    same inputs."""
    return tp * pp * ep * cp


def checkpoint_context(ckpt: str, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1,
                       cp_block: Optional[int] = None):
    """The run context (``training/run_context.py``) of ``--load ckpt`` at TP / PP / EP / CP,
    weights only: the checkpoint's vocabulary, Megatron's pipeline layout
    (``--pipeline-partition uniform``) and the causal CP split."""
    from ..training.run_context import RunContext

    return RunContext.build(checkpoint_run_config(ckpt, tp, pp, ep, cp, cp_block),
                            weights_only=True)


def load_converted(ckpt: str, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1,
                   cp_block: Optional[int] = None, run=None):
    """This rank's model chunk, loaded from ``ckpt``; the Megatron world must be set up
    with the same TP / PP / EP / CP. ``run``: its ``checkpoint_context`` (default: made
    here)."""
    from megatron.core import parallel_state

    from ..models import build_model
    from ..training.checkpoint.checkpointing import load_checkpoint
    from ..training.assembly.build_settings import build_settings

    run = run or checkpoint_context(ckpt, tp, pp, ep, cp, cp_block)
    media = media_token_ids(run.model_config, run.config.model)
    placements = run.plan.placements
    model = build_model(run.model_config, build_settings(run.config, placements), media,
                        placement=placements[parallel_state.get_pipeline_model_parallel_rank()])
    load_checkpoint(run.config, [model], None, None)
    return model.eval()


def _device() -> torch.device:
    return (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
            else torch.device("cpu"))


@torch.no_grad()
def logits(model, tokens: torch.Tensor, media,
           positions: Optional[torch.Tensor] = None, split=None) -> Optional[torch.Tensor]:
    """Full logits [B, S, padded vocab] on the last pipeline stage (None elsewhere):
    stage 0 sends its hidden states on, TP ranks gather their vocabulary shards; under
    context parallelism (``split``: a ``checkpoint_context``'s ``attention``) each CP rank
    runs its tokens of the planned split and the logits are gathered in sequence order.
    ``positions``: M-RoPE's [3, B, S] (default 0..S-1 on every axis)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if media is not None and torch.is_tensor(media):  # the tests' pixels alone
        media = {"image": media}
    device = _device()
    tokens = tokens.to(device)
    media = {k: v.to(device) for k, v in media.items()} if media else None
    if positions is None:
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    positions = positions.to(device)
    first, last = (parallel_state.is_pipeline_first_stage(),
                   parallel_state.is_pipeline_last_stage())
    cpm = None if split is None else split.mask_for({"tokens": tokens}, device=device)
    split = cpm is not None and not cpm.replicated
    rows = cpm.local.shape[0] if split else tokens.shape[1]
    if not first:  # its size first: a stage may send more than the hidden state
        prev = parallel_state.get_pipeline_model_parallel_prev_rank()
        size = torch.empty(1, dtype=torch.long, device=device)
        torch.distributed.recv(size, prev)
        hidden = torch.empty(int(size), device=device)
        torch.distributed.recv(hidden, prev)
        whole = (rows, tokens.shape[0], model.config.hidden_size)
        model.set_input_tensor(hidden.view(whole) if hidden.numel() == math.prod(whole)
                               else hidden.view(-1, 1, 1))
    out = model(tokens, positions, media, attention_mask=cpm)
    if not last:
        following = parallel_state.get_pipeline_model_parallel_next_rank()
        torch.distributed.send(torch.tensor([out.numel()], device=device), following)
        torch.distributed.send(out.contiguous().reshape(-1), following)
        return None
    out = gather_from_tensor_model_parallel_region(out)
    if split:  # [B, S_local, V] in the split's order -> [B, S, V]
        from ..models.cp_gather import gather_rows

        out = gather_rows(out.transpose(0, 1).contiguous(), cpm.counts, cpm.order,
                          cpm.group).transpose(0, 1)
    return out


class _Layout:  # what initialize_distributed reads
    virtual_pipeline_model_parallel_size = None
    distributed_backend = None  # NCCL with CUDA, gloo without
    distributed_timeout_minutes = 5

    def __init__(self, tp: int, pp: int, ep: int = 1, cp: int = 1):
        self.tensor_model_parallel_size, self.pipeline_model_parallel_size = tp, pp
        self.context_parallel_size = cp
        self.expert_model_parallel_size = ep
        self.expert_tensor_parallel_size = expert_tensor_parallel_size(tp, ep)


def rank_logits(ckpt: str, tp: int, pp: int, tokens, media,
                positions=None, ep: int = 1, cp: int = 1,
                cp_block: Optional[int] = None) -> Optional[torch.Tensor]:
    """In a fresh Megatron world of TP * PP * EP * CP ranks (torch.distributed's env
    variables set): this rank's full logits (last stage) or None."""
    from megatron.core import parallel_state

    from ..training.assembly.initialize import initialize_distributed, set_random_seed

    owns_group = not torch.distributed.is_initialized()
    parallel_state.destroy_model_parallel()
    initialize_distributed(_Layout(tp, pp, ep, cp))
    try:
        set_random_seed(1234)
        run = checkpoint_context(ckpt, tp, pp, ep, cp, cp_block)
        out = logits(load_converted(ckpt, run=run), tokens, media, positions, run.attention)
        return None if out is None else out.float().cpu()
    finally:
        parallel_state.destroy_model_parallel()
        if owns_group:
            torch.distributed.destroy_process_group()


# What an entry point has its fork server import (``multiprocessing.set_forkserver_preload``,
# before the first rank starts): Megatron-Core, prepared, and this module, once for every
# rank. Nothing in it initialises CUDA (the package asks NVML), so forked ranks can use it.
RANK_PRELOAD = ["megatron_mm.prepared", __name__]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank: int, world: int, port: int, out_dir: str, job: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    try:
        result = {"logits": rank_logits(*job)}
    except Exception as e:  # the parent reports it once
        from ..training.errors import USER_ERRORS

        result = {"user_error" if isinstance(e, USER_ERRORS) else "error":
                  str(e) if isinstance(e, USER_ERRORS) else traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"{rank}.pt"))


def megatron_logits(ckpt: str, tokens: torch.Tensor, media, tp: int = 1,
                    pp: int = 1, positions: Optional[torch.Tensor] = None,
                    ep: int = 1, cp: int = 1, cp_block: Optional[int] = None) -> torch.Tensor:
    """The megatron_mm model's full logits, from TP * PP * EP * CP processes forked here
    (this process alone when all are 1)."""
    world = world_size(tp, pp, ep, cp)
    job = (ckpt, tp, pp, tokens, media, positions, ep, cp, cp_block)
    if world == 1:
        return rank_logits(*job)
    import torch.multiprocessing as mp

    from ..startup import spawned

    # The ranks fork from this process's fork server, which imports RANK_PRELOAD once when
    # the entry point asked for it (a rank imports what the server lacks: seconds of CPU)
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(spawned, args=(f"{__name__}:_rank_entry", world, _free_port(),
                                          out_dir, job),
                           nprocs=world, start_method="forkserver", join=True)
        results = [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False)
                   for r in range(world)]
    for r in results:
        if "user_error" in r:
            raise ConversionError(r["user_error"])
    errors = [f"rank {i}:\n{r['error']}" for i, r in enumerate(results) if "error" in r]
    if errors:
        raise RuntimeError("\n".join(errors))
    return results[-1]["logits"]  # the last stage; TP ranks all hold the gathered logits


def compare(hf_dir: str, ckpt: str, inputs: Dict[str, torch.Tensor], tp: int = 1,
            pp: int = 1, ep: int = 1, cp: int = 1,
            cp_block: Optional[int] = None) -> Tuple[float, torch.Size]:
    """Max |logit difference| of the checkpoint (at TP / PP / EP / CP, the sequence split
    in blocks of ``cp_block`` tokens: default the training script's) and the Hugging Face
    model on ``inputs``, with the logits' shape."""
    from .convert import _hf_config

    family = family_for(_hf_config(hf_dir))
    check_inputs(family, inputs)  # bad input fails before any work
    # and a layout it cannot take
    longest = checkpoint_run_config(ckpt, tp, pp, ep, cp,
                                    cp_block).model.max_position_embeddings
    if inputs["input_ids"].shape[-1] > longest:
        raise ConversionError(
            f"--inputs key 'input_ids' has {inputs['input_ids'].shape[-1]} tokens per "
            f"sequence; the checkpoint takes at most {longest} (--max-position-embeddings; "
            f"capped at a Hugging Face sliding_window)")
    inputs = {k: (v.float() if torch.is_floating_point(v) else v) for k, v in inputs.items()}
    hf_config = _hf_config(hf_dir)
    model = load_hf(hf_dir, family)
    expected = hf_logits(model, inputs if family.hf_inputs is None
                         else family.hf_inputs(hf_config, inputs))
    del model
    media = (family.media or megatron_media)(inputs)
    positions = None if family.positions is None else family.positions(hf_config, inputs)
    got = megatron_logits(ckpt, inputs["input_ids"], media, tp, pp, positions, ep, cp,
                          cp_block)
    got = got[..., :expected.shape[-1]]  # the padded vocabulary rows
    if got.shape != expected.shape:
        raise RuntimeError(f"logit shapes differ: megatron_mm {tuple(got.shape)}, "
                           f"Hugging Face {tuple(expected.shape)}")
    return (got - expected).abs().max().item(), expected.shape

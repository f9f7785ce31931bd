"""A Megatron-LM model provider that wraps the user's own GPTModel.

``model_provider_for(language_model_provider)`` gives the function Megatron-LM's
``pretrain`` calls on every pipeline chunk, ``(pre_process, post_process, vp_stage,
config, pg_collection)``. It calls ``language_model_provider`` with the same arguments
(those its signature takes): any Megatron-Core GPTModel built from the user's
TransformerConfig and layer spec (LayerNorm or RMSNorm, GELU or SwiGLU, biases, MoE, TE
or local), then adds the encoders and projectors the package's flags describe, built by
their families, as ``MultimodalModel`` (``models/build.py: wrap_language_model``).

The vocabulary is the package tokenizer's: ``args.padded_vocab_size`` is set to it,
padded as Megatron-LM pads (``--make-vocab-size-divisible-by`` x TP), before the user's
provider reads it. Where the run needs the package's core attention (context
parallelism, bidirectional media, FlexAttention) the user's layer spec must carry it:
``language_layer_spec(spec)`` adds it (checked here, one error naming what to change).
"""

from __future__ import annotations

import inspect
from typing import Callable

from megatron.core import parallel_state

from ..config import ConfigError
from ..families import modalities_of
from ..models.build import chunk_layer_ids, layer_specs, wrap_language_model
from ..models.cp_attention import ContextParallelAttention
from ..models.flex_attention import FlexAttention
from ..models.multimodal import MultimodalModel
from ..models.specs import language_layer_for
from ..training.assembly.build_settings import build_settings
from ..training.cli.user_errors import exit_with_user_error
from .context import run_context

PROVIDER_ARGUMENTS = ("pre_process", "post_process", "vp_stage", "config", "pg_collection")


def _call(provider: Callable, **arguments):
    """``provider`` with the arguments its signature takes (all of them with ``**kwargs``)."""
    params = inspect.signature(provider).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return provider(**arguments)
    return provider(**{k: v for k, v in arguments.items() if k in params})


def model_provider_for(language_model_provider: Callable) -> Callable:
    """Megatron-LM's ``model_provider`` for ``pretrain``: the user's GPTModel of each chunk
    with the package's encoders and projectors around it."""

    def model_provider(pre_process: bool = True, post_process: bool = True,
                       vp_stage=None, config=None, pg_collection=None) -> MultimodalModel:
        try:
            return _provide(language_model_provider, pre_process, post_process, vp_stage,
                            config, pg_collection)
        except ConfigError as e:  # every rank the same: one line from rank 0, status 2
            exit_with_user_error(e)

    model_provider.language_model_provider = language_model_provider
    return model_provider


def _provide(language_model_provider, pre_process, post_process, vp_stage, config,
             pg_collection) -> MultimodalModel:
    run = run_context()
    pp = run.config.parallel.pipeline_model_parallel_size
    index = (vp_stage or 0) * pp + parallel_state.get_pipeline_model_parallel_rank()
    _check_schedule_hook(run)
    if not vp_stage:  # printed by global rank 0, before its first chunk is built
        _describe(run)
    placement = run.plan.placements[index]
    run.args.padded_vocab_size = run.model_config.language.vocab_size_padded(
        run.config.parallel.tensor_model_parallel_size)
    settings = build_settings(run.config, run.plan.placements)
    specs_before = _spec_calls[0]
    try:
        language_model = _call(language_model_provider, pre_process=pre_process,
                               post_process=post_process, vp_stage=vp_stage, config=config,
                               pg_collection=pg_collection)
    except Exception as e:
        needed = _needed_core_attention(settings)
        if needed is None or _spec_calls[0] != specs_before:
            raise
        # Megatron-Core's own check of the spec's attention (its DotProductAttention under
        # CP) fires first: the cause is the spec not passed through language_layer_spec
        raise ConfigError(
            f"the language model provider failed ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}) without passing its layer spec "
            f"through megatron_mm.megatron_lm.language_layer_spec: this run needs "
            f"{needed.__name__} in the GPT's layers ({_needed_because(settings)}): build "
            "the spec with language_layer_spec(spec)") from e
    _check_language_model(language_model, placement, vp_stage, index)
    _check_core_attention(language_model, settings)
    if pp > 1:  # micro-batches are padded to their own longest sample
        language_model.config.variable_seq_lengths = True
    media_ids = {m: run.tokenizer.media_token_id(m)
                 for enc in run.model_config.encoders.values() for m in modalities_of(enc)}
    return wrap_language_model(run.model_config, settings, language_model, media_ids,
                               placement, vp_stage, layer_specs(run.model_config, settings))


def _check_schedule_hook(run) -> None:
    """``--encoder-schedule coarse | bubble | separate`` (or auto's pick of them) runs
    through ``use_encoder_schedule``'s hook; without it Megatron-Core's schedule would run
    the encoders' chunks without their inputs."""
    if run.plan.encoder_plan is None and run.plan.separate is None:
        return
    import megatron.training.training as training

    from .schedules import EncoderSchedule

    if not isinstance(getattr(training.get_forward_backward_func, "__self__", None),
                      EncoderSchedule):
        raise ConfigError(
            f"--encoder-schedule {run.config.encoder_schedule.encoder_schedule} runs in "
            "Megatron-LM's train_step through megatron_mm.megatron_lm.use_encoder_schedule(), "
            "which is not installed: call pretrain(...) inside `with "
            "mm.use_encoder_schedule():` (or pass --encoder-schedule megatron)")


def _describe(run) -> None:
    """The encoder schedule and pipeline plan, once, in the log before the first
    iteration (as examples/pretrain_mllm.py prints them)."""
    from megatron.training.utils import print_rank_0

    text = run.plan.describe(run.config)
    if run.plan.encoder_plan is None and run.plan.separate is None:
        text = ("> encoder schedule megatron: Megatron-Core's schedule runs the model "
                "chunks" + ("\n" + text if text else ""))
    print_rank_0(text)


def _check_language_model(language_model, placement, vp_stage, index: int) -> None:
    """The user's GPT holds the LLM layers the plan gives this chunk (Megatron-Core's even
    split or the user's layout), and its embedding / output layer where the plan has them."""
    layers = list(chunk_layer_ids(language_model.config, vp_stage))
    planned = list(range(*placement.llm_layers))
    if layers != planned:
        raise ConfigError(
            f"pipeline chunk {index}: the language model provider built LLM layers "
            f"{layers[:1] + layers[-1:]} ({len(layers)}), the package's plan places "
            f"{len(planned)} there: pass --pipeline-partition uniform (Megatron-Core's even "
            "split, encoders on the first stage) or give the GPT the same "
            "--pipeline-model-parallel-layout")
    if bool(language_model.pre_process) != bool(placement.llm_embed) or \
            bool(language_model.post_process) != bool(placement.llm_head):
        raise ConfigError(
            f"pipeline chunk {index}: the language model provider's pre_process / "
            f"post_process ({language_model.pre_process}, {language_model.post_process}) "
            f"differ from the plan's ({placement.llm_embed}, {placement.llm_head}): build "
            "the GPT with the pre_process and post_process Megatron-LM passes")


_spec_calls = [0]  # language_layer_spec's calls: did the user's provider pass its spec?


def language_layer_spec(spec):
    """The user's GPT layer spec (a ``ModuleSpec`` of one layer, or a block spec's
    ``TransformerBlockSubmodules``, as ``get_gpt_decoder_block_spec`` gives for MoE) with
    the core attention and mask type this run needs (``models/specs.py:
    language_layer_for``): the package's CP attention under --context-parallel-size > 1
    (any mask, any token assignment), FlexAttention, TE's THD attention over packed rows;
    the spec unchanged where the run needs none of them. Call it inside the language
    model provider, once Megatron-LM has parsed the flags."""
    _spec_calls[0] += 1
    settings = build_settings(run_context().config)
    adapt = lambda layer: language_layer_for(  # noqa: E731
        layer, settings.transformer_impl, settings.context_parallel_size > 1,
        settings.cp_attention, settings.media_attention, settings.packed)
    if hasattr(spec, "layer_specs"):  # a block spec: each of its layers
        import dataclasses

        return dataclasses.replace(spec, layer_specs=[adapt(s) for s in spec.layer_specs])
    return adapt(spec)


def _check_core_attention(language_model, settings) -> None:
    """The GPT's layers hold the core attention the run needs (its spec went through
    ``language_layer_spec``): one error naming the fix, never a silent other attention."""
    needed = _needed_core_attention(settings)
    if needed is None:
        return
    for layer in getattr(language_model.decoder, "layers", ()):
        core = type(layer.self_attention.core_attention)
        if not issubclass(core, needed):
            raise ConfigError(
                f"the language model's layer {layer.layer_number} attends with "
                f"{core.__name__}, this run needs {needed.__name__} ("
                f"{_needed_because(settings)}): build the GPT's layer spec with "
                "megatron_mm.megatron_lm.language_layer_spec(spec)")


def _needed_core_attention(settings):
    """The package's core attention the run's GPT layers must hold, or None."""
    return (FlexAttention if settings.cp_attention == "flex" else
            ContextParallelAttention if settings.context_parallel_size > 1
            and settings.cp_attention == "ours" else None)


def _needed_because(settings) -> str:
    return (f"--context-parallel-size {settings.context_parallel_size}, attention "
            f"{settings.cp_attention}")

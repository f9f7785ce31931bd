"""FP8 flags: Megatron-LM's (same names, defaults and meanings), which modules they apply
to, and the CPU emulation. Validated up front; no torch import.

FP8 runs in Transformer Engine's layers. Without TE, Megatron-Core's ``get_fp8_context``
silently gives a null context and the run is not FP8: here that is an error, and
``--fp8-emulation`` is the explicit CPU alternative (a numerics check, not TE).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Optional

from ...config import ConfigError
from ...families import family_of
from ...plan.fp8 import (
    EMULATED_RECIPES,
    MEGATRON_NAMES,
    Fp8Settings,
    cp_block_error,
    fp8_align_size,
    parse_fp8_modules,
    sequence_multiple,
    weight_shard_rows,
)

# dest -> default, for "--fp8-* needs --fp8-format" (Megatron-LM ignores them silently).
_DEPENDENT_DEFAULTS = {
    "fp8_recipe": "delayed", "fp8_margin": 0, "fp8_amax_history_len": 1,
    "fp8_amax_compute_algo": "most_recent", "fp8_param_gather": False,
    "first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 1,
    "num_layers_at_end_in_bf16": 1, "tp_only_amax_red": False, "fp8_modules": "llm",
    "fp8_emulation": False,
}


def validate_fp8_args(config):
    """``config`` (the RunConfig, with its ``model_config``) with its ``fp8_settings`` (None
    without ``--fp8-format``; ``--fp8-emulation`` runs the local layers), or a ConfigError
    naming the flag to change."""
    if config.fp8.fp8 is None:
        for dest, default in _DEPENDENT_DEFAULTS.items():
            if getattr(config.fp8, dest) != default:
                raise ConfigError(f"--{dest.replace('_', '-')} needs --fp8-format "
                                  "(e4m3 or hybrid)")
        return dataclasses.replace(config, fp8_settings=None)
    encoders = config.model_config.encoders
    modules = parse_fp8_modules(config.fp8.fp8_modules, encoders)
    if config.fp8.fp8_amax_history_len < 1:
        raise ConfigError("--fp8-amax-history-len must be >= 1")
    if config.fp8.first_last_layers_bf16 and config.fp8.fp8_recipe == "delayed":
        raise ConfigError("--first-last-layers-bf16 does not work with --fp8-recipe delayed "
                          "(Megatron-Core: one amax reduction spans the whole stack); use "
                          "tensorwise, mxfp8 or blockwise")
    if not config.fp8.first_last_layers_bf16:
        for flag in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if getattr(config.fp8, flag) != 1:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --first-last-layers-bf16")
    if config.fp8.fp8_param_gather and not config.parallel.use_distributed_optimizer:
        raise ConfigError("--fp8-param-gather needs --use-distributed-optimizer")
    pp = config.parallel.pipeline_model_parallel_size
    stacks = {"llm": config.model_config.language.num_layers,
              **{name: enc.num_layers_built for name, enc in encoders.items()}}
    for name in modules:
        if name in stacks and config.fp8.first_last_layers_bf16:
            limit = stacks[name] // pp  # Megatron-Core: layers per pipeline stage
            for flag in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
                n = getattr(config.fp8, flag)
                if not 0 <= n <= limit:
                    raise ConfigError(f"--{flag.replace('_', '-')} ({n}) must be between 0 "
                                      f"and the {name} layers per pipeline stage ({limit})")
    _validate_media_alignment(config, modules)
    _validate_gemm_dims(config, modules)
    _validate_weight_shards(config, modules)
    if config.fp8.fp8_emulation:
        _validate_emulation(config)
    else:
        _validate_transformer_engine(config)
    settings = fp8_settings(config.fp8, modules)
    if "llm" in modules and config.parallel.context_parallel_size > 1:
        par = config.parallel
        error = cp_block_error(config.fp8.fp8_recipe, par.tensor_model_parallel_size,
                               par.sequence_parallel, par.context_parallel_block)
        if error:
            raise ConfigError(error)
    multiple = llm_sequence_multiple(settings, config.parallel)
    if config.model.seq_length % multiple:
        raise ConfigError(f"--seq-length ({config.model.seq_length}) must be a multiple of "
                          f"{multiple}: "
                          "FP8 LLM sequences are padded to it (the FP8 alignment with the "
                          "sequence- and context-parallel factors)")
    model = (dataclasses.replace(config.model, transformer_impl="local")
             if config.fp8.fp8_emulation else config.model)
    return dataclasses.replace(config, model=model, fp8_settings=settings)


def fp8_settings(fp8, modules) -> Fp8Settings:
    """The ``--fp8-*`` flags (``fp8``: the Fp8Args, or flags of its names) as
    ``Fp8Settings`` for ``modules`` (``parse_fp8_modules``)."""
    return Fp8Settings(**{name: getattr(fp8, flag)
                          for name, (flag, _) in MEGATRON_NAMES.items()},
                       modules=tuple(modules), emulation=fp8.fp8_emulation)


def transformer_engine_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _validate_transformer_engine(config) -> None:
    if config.model.transformer_impl == "local":
        raise ConfigError("--fp8-format runs in Transformer Engine layers: pass "
                          "--transformer-impl transformer_engine, or --fp8-emulation for the "
                          "CPU numerics check in the local layers")
    if not transformer_engine_installed():
        raise ConfigError("--fp8-format needs Transformer Engine, which is not installed "
                          "(Megatron-Core would silently train without FP8); install "
                          "transformer-engine[pytorch] on a GPU machine, or pass "
                          "--fp8-emulation for the CPU numerics check")
    if config.data.data_balance != "none":
        raise ConfigError("--fp8-format with --data-balance: packed sequences are not padded "
                          "to the FP8 alignment; drop one of them")


def _validate_emulation(config) -> None:
    if config.model.transformer_impl == "transformer_engine":
        raise ConfigError("--fp8-emulation emulates FP8 in the local layers: pass "
                          "--transformer-impl local, or drop --fp8-emulation to run FP8 in "
                          "Transformer Engine")
    if config.fp8.fp8_recipe not in EMULATED_RECIPES:
        raise ConfigError(f"--fp8-emulation emulates --fp8-recipe "
                          f"{' and '.join(EMULATED_RECIPES)} (per-tensor scales), not "
                          f"{config.fp8.fp8_recipe}: its block scales are Transformer "
                          "Engine's alone")
    if config.fp8.fp8_param_gather:
        raise ConfigError("--fp8-param-gather keeps weights in Transformer Engine's FP8 "
                          "tensors; --fp8-emulation does not emulate it")
    if config.recompute.recompute_granularity == "full":
        raise ConfigError("--fp8-emulation with --recompute-granularity full: Megatron-Core "
                          "recomputes FP8 blocks through Transformer Engine's checkpoint "
                          "(which restores the FP8 scaling state; the emulation has none); "
                          "drop the recompute")


def _validate_gemm_dims(config, modules) -> None:
    """TE's FP8 GEMMs take in-features (per TP shard) in multiples of the FP8 alignment:
    each FP8 linear's input width must be one."""
    align, tp = fp8_align_size(config.fp8.fp8_recipe), config.parallel.tensor_model_parallel_size
    lm = config.model_config.language
    checks = []
    if "llm" in modules:
        checks += [("llm", lm.hidden_size, "--hidden-size"),
                   ("llm", lm.num_attention_heads * lm.kv_channels // tp,
                    "--num-attention-heads x head size / TP"),
                   ("llm", lm.ffn_hidden_size // tp, "--ffn-hidden-size / TP")]
    for name, enc in config.model_config.encoders.items():
        p = enc.flag_prefix
        if name in modules:
            checks += [(name, enc.hidden_size, f"{p}hidden-size"),
                       (name, enc.hidden_size // tp, f"{p}hidden-size / TP"),
                       (name, enc.ffn_hidden_size // tp, f"{p}ffn-hidden-size / TP")]
        if f"{name}-projector" in modules:
            proj = config.model_config.projectors[name]
            checks.append((f"{name}-projector", enc.hidden_size, f"{p}hidden-size"))
            if proj.projector_type == "mlp":
                checks.append((f"{name}-projector", (proj.ffn_hidden_size or lm.hidden_size)
                               // tp, "--projector-ffn-hidden-size / TP"))
    if "llm" in modules and lm.linear_attention is not None:
        checks += _gdn_gemm_dims(lm.linear_attention, tp, align)
    for module, width, what in checks:
        if width % align:
            raise ConfigError(f"--fp8-modules {module}: {what} ({width}) must be a multiple of "
                              f"{align} (FP8 GEMM input width, --fp8-recipe "
                              f"{config.fp8.fp8_recipe}); change it or keep {module} out of "
                              "--fp8-modules")


def _gdn_gemm_dims(la, tp: int, align: int) -> list:
    """The Gated DeltaNet layers' FP8 shapes: ``out_proj``'s input (the value heads' width
    per TP shard) as every FP8 GEMM's, and Megatron-Core's own rule on ``in_proj``'s output
    (q, k, v, gate, beta, alpha together; ``_GDNBase.__init__`` asserts it)."""
    key = la.linear_key_head_dim * la.linear_num_key_heads
    value = la.linear_value_head_dim * la.linear_num_value_heads
    in_proj = 2 * key + 2 * value + 2 * la.linear_num_value_heads
    if in_proj % align:
        raise ConfigError(
            f"--fp8-modules llm: the Gated DeltaNet in_proj's output width 2 x (key heads x "
            f"dim + value heads x dim + --linear-num-value-heads) = {in_proj} must be a "
            f"multiple of {align} (Megatron-Core's GDN FP8 rule); change the --linear-* "
            "sizes or keep llm out of --fp8-modules")
    return [("llm", value // tp, "--linear-value-head-dim x --linear-num-value-heads / TP")]


def _validate_weight_shards(config, modules) -> None:
    """Transformer Engine checks each rank's FP8 weight as that rank holds it: a
    column-parallel linear's [out / TP, in] shard, whose rows must be a multiple of
    ``weight_shard_rows`` (8; MXFP8 32). The whole out-features may pass where the shard
    does not (Qwen3.5's GDN in_proj: 12352 rows, 3088 per rank at TP=4, not a multiple of
    32). Row-parallel weights ([out, in / TP]) hold the hidden size as rows and the GEMM
    input width as columns, both checked by ``_validate_gemm_dims``."""
    tp = config.parallel.tensor_model_parallel_size
    multiple = weight_shard_rows(config.fp8.fp8_recipe)
    lm = config.model_config.language
    shards = []  # (module, weight, its out-features, the flags that set them, TP)
    if "llm" in modules:
        qkv = (lm.num_attention_heads + 2 * lm.num_query_groups) * lm.kv_channels
        qkv += lm.num_attention_heads * lm.kv_channels if lm.attention_output_gate else 0
        shards += [("llm", "linear_qkv", qkv, "--num-attention-heads, --num-query-groups, "
                    "--kv-channels" + (", --attention-output-gate"
                                       if lm.attention_output_gate else ""), tp),
                   ("llm", "fc1", 2 * lm.ffn_hidden_size, "--ffn-hidden-size (gated)", tp)]
        la = lm.linear_attention
        if la is not None:
            key = la.linear_key_head_dim * la.linear_num_key_heads
            value = la.linear_value_head_dim * la.linear_num_value_heads
            shards.append(("llm", "Gated DeltaNet in_proj",
                           2 * key + 2 * value + 2 * la.linear_num_value_heads,
                           "the --linear-* sizes", tp))
        moe = lm.moe
        if moe is not None:
            etp = config.parallel.expert_tensor_parallel_size or tp
            shards.append(("llm", "expert fc1", 2 * moe.ffn_hidden_size,
                           "--moe-ffn-hidden-size (gated)", etp))
            if moe.shared_expert_intermediate_size:
                shards.append(("llm", "shared expert fc1",
                               2 * moe.shared_expert_intermediate_size,
                               "--moe-shared-expert-intermediate-size (gated)", tp))
    for name, enc in config.model_config.encoders.items():
        p = enc.flag_prefix
        if name in modules:
            shards += [(name, "linear_qkv", 3 * enc.hidden_size, f"{p}hidden-size", tp),
                       (name, "fc1", enc.ffn_hidden_size, f"{p}ffn-hidden-size", tp)]
    for module, weight, out, flags, size in shards:
        if out % size:
            continue  # not split evenly: Megatron-Core's own checks say so
        rows = out // size
        if rows % multiple:
            flag = ("--expert-tensor-parallel-size" if weight == "expert fc1"
                    else "--tensor-model-parallel-size")
            raise ConfigError(
                f"--fp8-modules {module}: each rank's {weight} weight shard has {out} / "
                f"{size} ({flag}) = {rows} rows, not a multiple of {multiple} "
                f"(Transformer Engine checks each TP rank's [out / TP, in] FP8 weight, "
                f"--fp8-recipe {config.fp8.fp8_recipe}); change {flags} or {flag}, or keep "
                f"{module} out of --fp8-modules")


def _validate_media_alignment(config, modules) -> None:
    """An FP8 encoder's GEMMs take its tokens per item as the leading dimension: they must
    come in multiples of the FP8 alignment for every batch size. An FP8 encoder or projector
    also cannot run as encoder replicas (an encoder TP below the LLM's): the replicas run
    different micro-batch counts, while the amax reduction group spans them; nor, with
    ``--encoder-schedule separate``, an FP8 encoder with delayed scaling on several
    replicas (``_separate_encoder_replicas``)."""
    align = fp8_align_size(config.fp8.fp8_recipe)
    etp = config.encoder_schedule.encoder_tensor_model_parallel_size
    separate = config.encoder_schedule.encoder_schedule == "separate"
    for name, enc in config.model_config.encoders.items():
        fp8_parts = [m for m in (name, f"{name}-projector") if m in modules]
        if not fp8_parts:
            continue
        if separate and name in modules:
            _separate_encoder_replicas(config, name)
        elif not separate and etp is not None and etp < config.parallel.tensor_model_parallel_size:
            raise ConfigError(f"--fp8-modules {','.join(fp8_parts)} with "
                              f"--encoder-tensor-model-parallel-size ({etp}) below "
                              f"--tensor-model-parallel-size: encoder replicas run different "
                              "micro-batch counts, and FP8's amax reduction spans them; "
                              "keep that encoder in BF16")
        sizes = _fp8_token_counts(config, name, enc)
        for part in fp8_parts:
            n, source = sizes[part]
            if n % align:
                raise ConfigError(f"--fp8-modules {part}: {n} tokens per item ({source}) is "
                                  f"not a multiple of the FP8 alignment {align} "
                                  f"(--fp8-recipe {config.fp8.fp8_recipe}); change the sizes or "
                                  f"keep {part} out of --fp8-modules")


def _fp8_token_counts(config, name: str, enc) -> dict:
    """The family's FP8 token counts per item; under --sequence-parallel those of each TP
    rank's shard, where the encoder's and its projector's GEMMs run (TE checks the local
    rows before its all-gather)."""
    family = family_of(enc)
    sizes = family.fp8_token_counts(name, enc)
    tp = (config.encoder_schedule.encoder_tensor_model_parallel_size
          or config.parallel.tensor_model_parallel_size)
    if not config.parallel.sequence_parallel or tp == 1:
        return sizes
    if family.fp8_shard_token_counts is not None:
        return family.fp8_shard_token_counts(name, enc, tp, config.fp8.fp8_recipe)
    return {part: (n // tp if n % tp == 0 else n / tp,
                   f"{source} over --tensor-model-parallel-size {tp} (sequence parallel)")
            for part, (n, source) in sizes.items()}


def _separate_encoder_replicas(config, name: str) -> None:
    """Delayed scaling max-reduces an FP8 encoder's amaxes over its replicas (Megatron-Core's
    amax group on the encoder ranks' grid: encoder TP x DP) at every autocast exit and
    backward, inside each ``EF`` / ``EB``; the separate program orders each replica's
    actions on its own (its share of the micro-batches, list-scheduled), so the replicas'
    reductions would not pair up."""
    own = getattr(config.encoder_schedule, f"{name}_encoder_data_parallel_size")
    replicas = (own
                or config.encoder_schedule.encoder_data_parallel_size or 1)
    if replicas > 1 and config.fp8.fp8_recipe == "delayed" and not config.fp8.tp_only_amax_red:
        flag = (f"--{name}-encoder-data-parallel-size"
                if own is not None
                else "--encoder-data-parallel-size")
        raise ConfigError(f"--fp8-modules {name} (--fp8-recipe delayed) with {flag} "
                          f"{replicas} under --encoder-schedule separate: the encoder "
                          "replicas reduce amaxes at every FP8 autocast exit and backward, "
                          "which their separately ordered actions would not pair up; run it "
                          "on one replica, with --fp8-recipe tensorwise or "
                          "--tp-only-amax-red, or keep it in BF16")


def llm_sequence_multiple(fp8: Optional[Fp8Settings], parallel) -> int:
    """What the collator pads each micro-batch's sequence length to
    (``plan.fp8.sequence_multiple``): TP under --sequence-parallel (each TP rank holds a
    shard of the sequence), with an FP8 LLM also the FP8 alignment and the CP factor;
    otherwise 1 (runs without FP8 or SP keep their shapes). ``parallel``: the run's
    parallel group."""
    fp8_llm = fp8 is not None and fp8.applies_to("llm")
    return sequence_multiple(fp8.recipe if fp8_llm else None,
                             parallel.tensor_model_parallel_size, parallel.sequence_parallel,
                             parallel.context_parallel_size if fp8_llm else 1,
                             getattr(parallel, "context_parallel_block", None))

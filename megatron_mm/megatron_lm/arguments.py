"""The package's flags on Megatron-LM's parser (``extra_args_provider``), and the package's
validated run configuration read back from Megatron-LM's parsed arguments.

A flag Megatron-LM already has (the same option string, or the same attribute name) is
Megatron-LM's: the package adds only its own, and reads the shared ones with Megatron-LM's
meaning, converted where Megatron-LM stores the same value in another form (a one-element
list, an enum member: ``CONVERSIONS``) or under another attribute (``ATTRIBUTES``).
``tests/megatron_lm/test_arguments.py`` fails on any shared flag whose meaning differs."""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
from typing import Any, Callable, Dict, Optional

from ..config import ConfigError
from ..data.tokenizer import MEGATRON_LM_TOKENIZERS
from ..training.cli.arguments import build_parser
from ..training.config.run_config import RunConfig
from ..training.cli.user_errors import exit_with_user_error

GROUP_TITLE = "megatron_mm (multimodal: encoders, projectors, data, schedules)"

# The package's attribute -> Megatron-LM's, where Megatron-LM keeps the flag under another
ATTRIBUTES = {"norm_epsilon": "layernorm_epsilon",
              "apply_layernorm_1p": "layernorm_zero_centered_gamma"}


def _one(flag: str) -> Callable[[Any], Any]:
    """A Megatron-LM list flag (``nargs='+'``) the package takes one value of."""
    def convert(value):
        if not isinstance(value, (list, tuple)):
            return value
        if len(value) != 1:
            raise ConfigError(f"--{flag} takes one value with the package's model "
                              f"(got {list(value)})")
        return value[0]
    return convert


def _name(value):  # Megatron-LM's enum members (AttnBackend, signal.Signals): their names
    return getattr(value, "name", value)


# Megatron-LM's tokenizers -> the package's: the one the data are encoded with
TOKENIZERS = MEGATRON_LM_TOKENIZERS


def _tokenizer(value):
    if value in TOKENIZERS:
        return TOKENIZERS[value]
    if value in TOKENIZERS.values():  # the package's own name (its checkpoints save it)
        return value
    raise ConfigError(f"--tokenizer-type {value}: the package encodes its samples (text with "
                      f"media placeholders) with one of {sorted(TOKENIZERS)} and "
                      "--tokenizer-model")


def _cp_comm_type(value):
    """Megatron-LM's default ``['p2p']`` is its TE attention's default, given or not: the
    package's CP attention (which takes none) then runs where TE's cannot."""
    value = _one("cp-comm-type")(value)
    return None if value == "p2p" else value


def _list_or_none(value):
    return list(value) if value else None


# The package's choices Megatron-LM's flag of the same name cannot give (its parser refuses
# them): what the package cannot do under Megatron-LM's loop, and why
NOT_REACHABLE = {
    "attention_backend": {"flex": "Megatron-LM's --attention-backend is its AttnBackend enum"},
    "tokenizer_type": {"MistralV1SentencePiece": "pass --tokenizer-type "
                       "SentencePieceTokenizer --tokenizer-model FILE"},
}

CONVERSIONS: Dict[str, Callable[[Any], Any]] = {
    "attention_backend": _name,
    "exit_signal": _name,
    "cp_comm_type": _cp_comm_type,
    "moe_aux_loss_coeff": _one("moe-aux-loss-coeff"),
    "moe_router_load_balancing_type": _one("moe-router-load-balancing-type"),
    "valid_data_path": _one("valid-data-path"),
    "data_path": _list_or_none,
    "rotary_base": float,
    "tokenizer_type": _tokenizer,
}


# The package's flags Megatron-LM has under another flag of the same meaning, whose
# attribute Megatron-LM reads: ``validate_args`` derives ``virtual_pipeline_model_parallel_size``
# from its own VPP flags only (resetting it otherwise), so the package's flag sets Megatron-LM's
ALIASES = {"virtual_pipeline_model_parallel_size": "num_virtual_stages_per_pipeline_rank"}


def _own_actions(parser: argparse.ArgumentParser):
    """The package's flags that ``parser`` lacks, and those it has (Megatron-LM's)."""
    options = set(parser._option_string_actions)
    dests = {a.dest for a in parser._actions}
    own, shared = [], []
    for action in build_parser()._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        taken = set(action.option_strings) & options or ATTRIBUTES.get(
            action.dest, action.dest) in dests
        (shared if taken else own).append(action)
    return own, shared


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron-LM's ``extra_args_provider``: the package's flags that ``parser`` (Megatron-
    LM's, with the script's own) does not have, in one group; returns ``parser``."""
    own, _ = _own_actions(parser)
    dests = {a.dest for a in parser._actions}
    group = parser.add_argument_group(GROUP_TITLE)
    for action in own:
        action = copy.copy(action)
        if ALIASES.get(action.dest) in dests:
            action.dest = ALIASES[action.dest]
        group._add_action(action)
    return parser


def shared_flags(parser: argparse.ArgumentParser) -> list:
    """The package's flags that ``parser`` already has (read with its meaning)."""
    return _own_actions(parser)[1]


def run_config_from_args(args: argparse.Namespace, world_size: Optional[int] = None,
                         argv: Optional[list] = None) -> RunConfig:
    """The package's validated RunConfig of Megatron-LM's parsed ``args`` (its own flags as
    ``add_args`` added them, the shared ones converted): a bad flag raises a ConfigError
    naming it. Megatron-LM's training loop runs the model, optimizer and schedule; the
    RunConfig decides the encoders, projectors, data and attention. With ``--load``, the
    package's architecture flags not on the command line (``argv``, default
    ``sys.argv[1:]``) come from the checkpoint, as in examples/pretrain_mllm.py (a
    converted checkpoint names its encoders there)."""
    values = {}
    for action in build_parser()._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        theirs = ATTRIBUTES.get(action.dest, action.dest)
        if hasattr(args, theirs):
            value = getattr(args, theirs)
            values[action.dest] = CONVERSIONS.get(action.dest, lambda v: v)(value)
        else:
            values[action.dest] = action.default
    if values.get("num_experts") is None:  # Megatron-LM derives them for a dense LLM too
        from ..training.config.moe_args import moe_only

        values.update(moe_only())
    if values.get("load"):
        _checkpoint_architecture(values, sys.argv[1:] if argv is None else argv)
    if values.get("virtual_pipeline_model_parallel_size") is not None:
        values["num_layers_per_virtual_pipeline_stage"] = None  # Megatron-LM derived it
    if values.get("eval_interval") is None:
        values["eval_interval"] = max(values.get("train_iters") or 1, 1)
    world = world_size if world_size is not None else getattr(args, "world_size", None)
    return RunConfig.from_flags(argparse.Namespace(**values)).validated(world)


def check_args(args: argparse.Namespace) -> None:
    """After Megatron-LM's ``parse_and_validate_args``, before ``pretrain``: the package's
    flags checked together with Megatron-LM's; a bad one exits every rank with one line
    from rank 0 (status 2), before any process group exists."""
    try:
        if args.dataloader_type != "external":
            raise ConfigError(
                f"--dataloader-type {args.dataloader_type}: the package's data are batched "
                "by its own collate, balancer or Energon loader: pass --dataloader-type "
                "external")
        config = run_config_from_args(args)
        if config.encoder_schedule.encoder_schedule == "separate":
            raise ConfigError(
                "--encoder-schedule separate puts the encoders on ranks of their own, a world "
                "Megatron-LM's initialize_model_parallel does not build: run it with "
                "examples/pretrain_mllm.py")
        if args.pipeline_model_parallel_size > 1:
            from .context import run_context

            _check_pipeline_layout(args, run_context(args))
    except ConfigError as e:
        exit_with_user_error(e)


def megatron_layers_per_chunk(args: argparse.Namespace) -> list:
    """The LLM decoder layers Megatron-Core builds in each pipeline chunk (chunk v x PP + r:
    virtual stage v of rank r) from Megatron-LM's flags, as ``get_num_layers_to_build``
    counts them; no process group needed."""
    from types import SimpleNamespace

    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout)
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size or 1
    layout = args.pipeline_model_parallel_layout
    if isinstance(layout, str):
        layout = PipelineParallelLayerLayout(layout, pp)
    if layout is not None:
        return [layout.layout[r][v].count(LayerType.decoder)
                for v in range(vpp) for r in range(pp)]
    config = SimpleNamespace(
        pipeline_model_parallel_layout=None, num_layers=args.num_layers,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=args.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=args.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size)
    return [get_num_layers_to_build(config, vp_stage=v if vpp > 1 else None, pp_rank=r)
            for v in range(vpp) for r in range(pp)]


def _check_pipeline_layout(args: argparse.Namespace, run) -> None:
    """The package's plan (``--pipeline-partition``) gives each chunk the LLM layers the
    user's GPT builds from Megatron-LM's flags; else one error with the flags that give
    the plan's layout (``tools/plan.py --megatron-lm-args``)."""
    from ..plan.pipeline.megatron_lm_args import llm_layout_args

    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size or 1
    planned = [len(range(*p.llm_layers)) for p in run.plan.placements]
    built = megatron_layers_per_chunk(args)
    if planned == built:
        return
    flags = llm_layout_args(planned, pp, vpp).flags()
    raise ConfigError(
        f"--pipeline-partition {run.config.pipeline.pipeline_partition}: the package's plan "
        f"gives the pipeline chunks {planned} LLM layers, Megatron-LM's flags build {built}: "
        f"pass {shlex.join(flags)} (tools/plan.py --megatron-lm-args prints them) or "
        "--pipeline-partition uniform")


def _given(argv: list) -> set:
    """The package's flags written in ``argv`` (Megatron-LM's command line)."""
    probe = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for action in build_parser()._actions:
        if action.option_strings and "-h" not in action.option_strings:
            action = copy.copy(action)
            action.default, action.choices, action.type = argparse.SUPPRESS, None, None
            probe._add_action(action)
    return set(vars(probe.parse_known_args(argv)[0]))


def _checkpoint_architecture(values: dict, argv: list) -> None:
    """``training.arguments.apply_checkpoint_args`` on the converted values: flags left out
    come from the checkpoint ``--load`` names (saved by either script, in either's form),
    flags given must agree with it."""
    from ..training.cli.arguments import CHECKPOINT_FLAGS, CHECKPOINT_PATH_FLAGS
    from ..training.checkpoint.checkpointing import CheckpointError, saved_args
    from ..training.config.run_config import group_of_flags

    try:
        saved = saved_args(group_of_flags("checkpoint", argparse.Namespace(**values)))
    except CheckpointError:
        return  # reported with the other --load problems when Megatron-LM loads
    given = _given(argv)
    for dest in CHECKPOINT_FLAGS:
        theirs = ATTRIBUTES.get(dest, dest)
        if dest not in saved and theirs not in saved:
            continue
        value = saved[dest] if dest in saved else saved[theirs]
        if value is None:  # the checkpoint's run left it to its default: nothing fixed
            continue
        try:
            value = CONVERSIONS.get(dest, lambda v: v)(value)
        except ConfigError:
            continue
        if dest in CHECKPOINT_PATH_FLAGS and value and not os.path.isabs(value):
            value = os.path.join(values["load"], value)
        if isinstance(value, list):
            value = tuple(value)
        mine = values.get(dest)
        if isinstance(mine, list):
            mine = tuple(mine)
        if dest in given and mine != value:
            raise ConfigError(f"--{dest.replace('_', '-')} {values.get(dest)} disagrees with "
                              f"the checkpoint in --load {values['load']} ({value}); drop "
                              "the flag to use the checkpoint's value")
        if dest not in given:
            values[dest] = value

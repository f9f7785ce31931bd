"""The package's flags on Megatron-LM's parser (``extra_args_provider``), and the package's
validated run configuration read back from Megatron-LM's parsed arguments.

A flag Megatron-LM already has (the same option string, or the same attribute name) is
Megatron-LM's: the package adds only its own, and reads the shared ones with Megatron-LM's
meaning, converted where Megatron-LM stores the same value in another form (a one-element
list, an enum member: ``CONVERSIONS``) or under another attribute (``ATTRIBUTES``).
``tests/megatron_lm/test_arguments.py`` fails on any shared flag whose meaning differs.
No torch import."""

from __future__ import annotations

import argparse
import copy
from typing import Any, Callable, Dict, Optional

from ..config import ConfigError
from ..training.arguments import build_parser, validate_args
from ..training.run_config import RunConfig

GROUP_TITLE = "megatron_mm (multimodal: encoders, projectors, data, schedules)"

# The package's attribute -> Megatron-LM's, where Megatron-LM keeps the flag under another
ATTRIBUTES = {"norm_epsilon": "layernorm_epsilon"}


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
TOKENIZERS = {"HuggingFaceTokenizer": "HuggingFaceTokenizer",
              "SentencePieceTokenizer": "SentencePiece",
              "GPTSentencePieceTokenizer": "SentencePiece"}


def _tokenizer(value):
    if value in TOKENIZERS:
        return TOKENIZERS[value]
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
    group = parser.add_argument_group(GROUP_TITLE)
    for action in own:
        group._add_action(copy.copy(action))
    return parser


def shared_flags(parser: argparse.ArgumentParser) -> list:
    """The package's flags that ``parser`` already has (read with its meaning)."""
    return _own_actions(parser)[1]


def run_config_from_args(args: argparse.Namespace,
                         world_size: Optional[int] = None) -> RunConfig:
    """The package's validated RunConfig of Megatron-LM's parsed ``args`` (its own flags as
    ``add_args`` added them, the shared ones converted): a bad flag raises a ConfigError
    naming it. Megatron-LM's training loop runs the model, optimizer and schedule; the
    RunConfig decides the encoders, projectors, data and attention."""
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
        from ..training.moe_args import MOE_ONLY

        values.update(MOE_ONLY)
    if values.get("virtual_pipeline_model_parallel_size") is not None:
        values["num_layers_per_virtual_pipeline_stage"] = None  # Megatron-LM derived it
    if values.get("eval_interval") is None:
        values["eval_interval"] = max(values.get("train_iters") or 1, 1)
    world = world_size if world_size is not None else getattr(args, "world_size", None)
    return RunConfig.from_flags(validate_args(argparse.Namespace(**values), world))

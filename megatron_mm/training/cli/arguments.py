"""Megatron-style command-line arguments, validated up front.

Flags keep Megatron-LM's names and meanings (``--tensor-model-parallel-size``,
``--freeze-LM``, ``--eval-iters`` ...); flags for new ideas follow the same style. The parser
is made from the typed groups (``config/groups/``); a bad flag is reported before any
process group exists, once per job.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from ...config import ConfigError
from ...families import FAMILIES, SLOTS
from ..config.groups import SECTIONS, AudioEncoderArgs, VisionEncoderArgs
from ..config.moe_args import refuse_moe_flags_given_to_dense
from ..config.run_config import RunConfig
from ..config.validation import validate_args
from ..config.values import (CHECKPOINT_FLAGS, CHECKPOINT_PATH_FLAGS,  # noqa: F401
                             checkpoint_values)
from .recipe_flags import recipe_defaults, split_recipe
from .user_errors import ArgumentParser, exit_with_user_error


def build_parser() -> argparse.ArgumentParser:
    """The package's parser, made from the typed groups (``groups/``) by Megatron-LM's
    ``ArgumentGroupFactory``: one --help section per group (the model group's four), each
    encoder family's own flags after its slot's section."""
    from .flag_factory import add_group  # Megatron-LM's factory imports megatron.core

    p = ArgumentParser(
        description="Train a multimodal LLM with Megatron-Core (megatron_mm)",
        epilog="--recipe NAME: a recipe's values (megatron_mm/recipes, "
               "docs/recipes.md) as the defaults; the flags given win",
        allow_abbrev=False)
    family_sections = {slot: [] for slot in SLOTS}
    for fam in FAMILIES.values():
        if fam.flags is not None and fam.flags not in family_sections[fam.slot]:
            family_sections[fam.slot].append(fam.flags)
    for cls, title in SECTIONS:
        add_group(p, cls, title)
        slot = {VisionEncoderArgs: "vision", AudioEncoderArgs: "audio"}.get(cls)
        for flags in family_sections.get(slot, ()):
            add_group(p, flags, f"{title}: {flags.__name__}")
    return p


def parse_args(argv: Optional[Sequence[str]] = None,
               world_size: Optional[int] = None) -> argparse.Namespace:
    """``read_args``, a bad flag reported once per job (one line naming it) and exiting."""
    try:
        return read_args(argv, world_size)
    except ConfigError as e:  # once per job, without argparse's usage
        exit_with_user_error(e, build_parser().prog)


def parse_run_config(argv: Optional[Sequence[str]] = None,
                     world_size: Optional[int] = None) -> RunConfig:
    """The command line's RunConfig (``parse_args``: a bad flag exits with one line naming
    it)."""
    return RunConfig.from_flags(parse_args(argv, world_size))


def read_args(argv: Optional[Sequence[str]] = None,
              world_size: Optional[int] = None) -> argparse.Namespace:
    """The flags of ``argv`` with those the checkpoint ``--load`` names fixes, checked
    (a ConfigError names the flag), with Megatron's derived values; the run reads them as
    a ``run_config.RunConfig``. ``--recipe NAME``: that recipe's values are the defaults."""
    recipe, argv = split_recipe(argv)
    parser = build_parser()
    if recipe is not None:
        recipe_defaults(parser, recipe)
    args = parser.parse_args(argv)
    given = given_flags(argv)
    apply_checkpoint_args(args, given)
    refuse_moe_flags_given_to_dense(args, given)
    return validate_args(args, world_size)


def given_flags(argv: Optional[Sequence[str]]) -> set:
    """The dests of the flags written on the command line (not left at their default)."""
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    return set(vars(probe.parse_args(argv)))


def apply_checkpoint_args(args: argparse.Namespace, given: set) -> None:
    """Take the architecture from the checkpoint ``--load`` names: flags left out come
    from it, flags given must agree with it (``config/values.py: checkpoint_values``)."""
    from ..config.run_config import group_of_flags

    values = checkpoint_values(args.load, {dest: getattr(args, dest) for dest in given},
                               group_of_flags("checkpoint", args) if args.load else None)
    for dest, value in values.items():
        setattr(args, dest, value)

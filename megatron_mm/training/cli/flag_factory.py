"""The typed groups' flags, made by Megatron-LM's ``ArgumentGroupFactory``
(``megatron/training/argument_utils.py``) as Megatron-LM makes its own from its configs."""

from __future__ import annotations

import argparse
import copy
import typing

from megatron.training.argument_utils import ArgumentGroupFactory

from ..config.groups import derived_names


class FlagGroupFactory(ArgumentGroupFactory):
    """Megatron-LM's factory, with the two things the package's fields need: annotations
    resolved (a module with postponed annotations holds them as strings), and a boolean
    field whose ``argparse_meta`` sets its action keeping its own flag name (the factory
    names a flag whose default is not False ``--no-*`` / ``--disable-*``)."""

    _docstrings: dict = {}  # class -> its fields' docstrings (read from its source once)

    def _get_field_docstrings(self, src_cfg_class: type) -> dict:
        if src_cfg_class not in self._docstrings:
            self._docstrings[src_cfg_class] = super()._get_field_docstrings(src_cfg_class)
        return self._docstrings[src_cfg_class]

    def __init__(self, src_cfg_class: type) -> None:
        super().__init__(src_cfg_class, exclude=list(derived_names(src_cfg_class)))
        self.hints = typing.get_type_hints(src_cfg_class)

    def _extract_type(self, config_type):
        args = [a for a in typing.get_args(config_type) if a is not type(None)]
        if typing.get_origin(config_type) is typing.Union and len(args) > 1:
            return {"type": None}  # its argparse_meta gives the type (--moe-layer-freq)
        return super()._extract_type(config_type)

    def _build_argparse_kwargs_from_field(self, attribute):
        attribute = copy.copy(attribute)
        attribute.type = self.hints[attribute.name]
        kwargs = super()._build_argparse_kwargs_from_field(attribute)
        meta = attribute.metadata.get("argparse_meta", {})
        if "action" in meta and "arg_names" not in meta:
            kwargs["arg_names"] = [self._format_arg_name(attribute.name)]
        return kwargs


def add_group(parser: argparse.ArgumentParser, cls: type, title: str):
    """One --help section of ``parser``: the flags of ``cls``'s fields."""
    return FlagGroupFactory(cls).build_group(parser, title=title)

"""Let ``--help`` of a Megatron-LM script print.

Megatron-LM (megatron-core 0.19.2's wheel) builds the flags of its config dataclasses with
``ArgumentGroupFactory``, whose ``ArgumentGroupFactory._build_argparse_kwargs_from_field``
takes each flag's help
from the field's docstring as is. argparse formats help as a ``%``-template, so a docstring
with a literal ``%`` breaks ``--help`` of every script: ``TransformerConfig.
moe_paged_stash_buffer_size_factor_cuda``'s "(e.g. 1.10 = 10%)." stopped it with
"ValueError: unsupported format character ')'". The docstring is prose, not a template:
its ``%`` are escaped (upstream patch: patches/0008-argument-help-escapes-percent.patch).
"""

from .after_import import after_import


def _escaped(build):
    def build_kwargs(self, attribute):
        kwargs = build(self, attribute)
        doc = self.field_docstrings.get(attribute.name)
        if isinstance(kwargs.get("help"), str) and kwargs["help"] == doc:
            kwargs["help"] = doc.replace("%", "%%")
        return kwargs
    build_kwargs.__wrapped__ = build
    return build_kwargs


def _patch(module) -> None:
    factory = module.ArgumentGroupFactory
    if not hasattr(factory._build_argparse_kwargs_from_field, "__wrapped__"):
        factory._build_argparse_kwargs_from_field = _escaped(
            factory._build_argparse_kwargs_from_field)


def apply() -> None:
    after_import("megatron.training.argument_utils", _patch)

"""Declarative weight mappings: a table of rules, each one Megatron tensor name pattern,
the Hugging Face tensor names it is made of, and a named transform.

``{i}`` in a pattern is a layer index, ``{e}`` an expert's (an MoE layer's). A rule
applies to every tensor of the built model its Megatron pattern matches, so one table
serves a model with or without QKV bias, q/k norm, a class token, an untied output layer
or MoE layers: what the model does not have is skipped.
Tables are written in the local layers' names; ``MappingTable(rules, "transformer_engine")``
serves a model built with Transformer Engine layers (``models/te_names.py``: fused norms
renamed, TE's ``_extra_state`` module state left to the model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Set, Tuple

import torch

from ..models.te_names import is_module_state, to_te
from .errors import ConversionError
from .transforms import IDENTITY, Context, Transform


@dataclass(frozen=True)
class Rule:
    megatron: str
    hf: Tuple[str, ...]
    transform: Transform = IDENTITY

    def regex(self) -> re.Pattern:
        # {i}: a layer index; {e}: an expert's
        return re.compile(re.sub(r"\\\{([ie])\\\}", r"(?P<\1>\\d+)",
                                 re.escape(self.megatron)))


def prefixed(rules: Iterable[Rule], megatron_prefix: str, hf_prefix: str) -> Tuple[Rule, ...]:
    """The same rules under other module prefixes (one table per submodule)."""
    return tuple(Rule(megatron_prefix + r.megatron, tuple(hf_prefix + h for h in r.hf),
                      r.transform) for r in rules)


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def in_transformer_impl(rules: Iterable[Rule], transformer_impl: str) -> Tuple[Rule, ...]:
    """The same rules with the Megatron names of ``transformer_impl``'s layers."""
    if transformer_impl == "local":
        return tuple(rules)
    return tuple(Rule(to_te(r.megatron), r.hf, r.transform) for r in rules)


class MappingTable:
    def __init__(self, rules: Iterable[Rule], transformer_impl: str = "local"):
        self.rules = in_transformer_impl(rules, transformer_impl)
        self._compiled = [(r, r.regex()) for r in self.rules]

    def rule_for(self, name: str):
        """The rule for the Megatron tensor ``name`` and its pattern's groups ({i}, {e})."""
        return self._rule_for(name)

    def _rule_for(self, name: str):
        for rule, regex in self._compiled:
            m = regex.fullmatch(name)
            if m:
                return rule, m.groupdict()
        raise ConversionError(f"no mapping rule for the Megatron tensor {name}")

    def to_megatron(self, hf: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                    ctx: Context) -> Tuple[Dict[str, torch.Tensor], Set[str]]:
        """Megatron tensors for every name in ``expected`` (the built model's state dict,
        whose shapes they must have), and the set of Hugging Face names used."""
        out, used = {}, set()
        for name, target in expected.items():
            if is_module_state(name):
                continue
            rule, groups = self._rule_for(name)
            sources = [h.format(**groups) for h in rule.hf]
            missing = [s for s in sources if s not in hf]
            if missing:
                raise ConversionError(
                    f"the Hugging Face checkpoint lacks {', '.join(missing)} (needed for "
                    f"{name})")
            tensors = [hf[s] for s in sources]
            try:
                value = rule.transform.to_megatron(tensors, ctx)
            except RuntimeError as e:
                value, reason = None, str(e)
            if value is None or value.shape != target.shape:
                got = ", ".join(f"{s} {_shape(t)}" for s, t in zip(sources, tensors))
                raise ConversionError(
                    f"shape mismatch for {name}: expected {_shape(target)} from {got} "
                    f"({rule.transform})" + ("" if value is not None else f": {reason}"))
            out[name] = value.to(target.dtype)
            used.update(sources)
        return out, used

    def to_hf(self, megatron: Mapping[str, torch.Tensor], ctx: Context) -> Dict[str, torch.Tensor]:
        out = {}
        for name, tensor in megatron.items():
            if is_module_state(name):
                continue
            rule, groups = self._rule_for(name)
            for h, t in zip(rule.hf, rule.transform.to_hf(tensor, ctx)):
                out[h.format(**groups)] = t
        return out

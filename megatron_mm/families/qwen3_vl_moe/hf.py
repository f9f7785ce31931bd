"""Qwen3VLMoeForConditionalGeneration for the converter: Qwen3-VL's table, flags and
``compare`` inputs, with Qwen3-MoE's router and experts in the LLM's sparse layers.

Its router always renormalises the top-k probabilities (the text config has no
``norm_topk_prob``) and it has no shared experts. The experts are fused per layer, in two
orientations: the hub's files hold ``mlp.experts.gate_up_proj`` [E, H, 2I] and
``down_proj`` [E, I, H], transformers 5 (in memory and in what it saves) [E, 2I, H] and
[E, H, I]. Import takes either, as transformers does: a tensor already in transformers 5's
shape is taken as it is (so also a square one), any other transposed; the hidden size H
comes from the layer's router (``mlp.gate.weight`` [E, H]). Import records which
orientation the files used (``recorded``) and export writes that one (transformers 5's
where unknown), so the files that went in come back; a square tensor (2I = H, or I = H)
is always written in transformers 5's orientation, which is how transformers 5 reads it.
"""

from __future__ import annotations

from typing import Dict, Mapping

import torch

from ...hf.families import Family, Flags
from ...hf.layouts import CAUSAL_LM
from ...hf.mapping import prefixed
from ..qwen3_moe.hf import MOE_LAYER, ExpertLayout, expert_flags
from ..qwen3_vl import hf as qwen3_vl

ARCH = "Qwen3VLMoeForConditionalGeneration"
_EXPERTS = ".mlp.experts."


def rules(hf_config):
    return (qwen3_vl.rules(hf_config)
            + prefixed(MOE_LAYER, "language_model.", "model.language_model."))


def model_flags(hf_config) -> Flags:
    return {**qwen3_vl.model_flags(hf_config),
            **expert_flags(hf_config.get_text_config(), "Qwen3VLForConditionalGeneration",
                           "text_config.")}


HUB, TRANSFORMERS = "hub", "transformers"  # [E, H, 2I] / [E, I, H]; [E, 2I, H] / [E, H, I]
ORIENTATION = "fused_experts"  # its key in what import records


def _hub_oriented(tensors: Mapping) -> list:
    """The fused expert tensors of ``tensors`` in the hub's orientation."""
    out = []
    for name, t in tensors.items():
        head, fused, kind = name.rpartition(_EXPERTS)
        if not fused or kind not in ("gate_up_proj", "down_proj"):
            continue
        router = tensors.get(head + ".mlp.gate.weight")  # none: the table says so
        hidden = t.shape[2 if kind == "gate_up_proj" else 1]
        if router is not None and hidden != router.shape[1]:
            out.append(name)
    return out


class FusedExpertLayout(ExpertLayout):
    """Either fused orientation in, per-expert tensors for the table; fused tensors out,
    in the orientation the imported files used."""

    def normalise(self, tensors: Mapping) -> Dict:
        tensors = dict(tensors)
        for name in _hub_oriented(tensors):
            tensors[name] = tensors[name].transpose(1, 2)
        return super().normalise(tensors)

    def recorded(self, tensors: Mapping) -> Dict:
        return {ORIENTATION: HUB if _hub_oriented(tensors) else TRANSFORMERS}

    def written(self, tensors: Mapping, recorded: Mapping = None) -> Dict:
        hub_files = (recorded or {}).get(ORIENTATION, TRANSFORMERS) == HUB
        out, experts = {}, {}
        for name, t in tensors.items():
            head, fused, rest = name.rpartition(_EXPERTS)
            if fused:
                e, kind = rest.split(".", 1)
                experts.setdefault(head, {}).setdefault(kind, {})[int(e)] = t
            else:
                out[name] = t
        for head, kinds in experts.items():
            def stacked(kind):
                return torch.stack([kinds[kind][e] for e in sorted(kinds[kind])])
            fused = {"gate_up_proj": torch.cat([stacked("gate_proj.weight"),
                                                stacked("up_proj.weight")], dim=1),
                     "down_proj": stacked("down_proj.weight")}
            for kind, t in fused.items():  # [E, 2I, H], [E, H, I]: transposed for the hub's
                hub = hub_files and t.shape[1] != t.shape[2]
                out[head + _EXPERTS + kind] = t.transpose(1, 2).contiguous() if hub else t
        return super().written(out)


# Qwen3-VL's text model (q / k norms, interleaved M-RoPE) with MoE layers.
TEXT_MODELS = {"qwen3_vl_moe_text": qwen3_vl.TEXT_MODELS["qwen3_vl_text"]}

ARCHITECTURES = {ARCH: Family(
    ARCH, FusedExpertLayout(aliases=CAUSAL_LM.aliases, export=CAUSAL_LM.export), rules, True,
    inputs=qwen3_vl.INPUTS, flags=model_flags, config_rules=True,
    media=qwen3_vl.megatron_media, positions=qwen3_vl.position_ids,
    hf_inputs=qwen3_vl.hf_inputs, file_flags=qwen3_vl.processor_flags)}

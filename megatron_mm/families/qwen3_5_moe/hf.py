"""Qwen3_5MoeForConditionalGeneration for the converter: Qwen3.5's table, flags and
``compare`` inputs, with Qwen3-MoE's router and experts and the shared expert in every
layer (``mlp.shared_experts.*`` <- ``mlp.shared_expert.*``, its gate ``gate_weight`` <-
``mlp.shared_expert_gate.weight``).

transformers 5 holds the experts fused (``mlp.experts.gate_up_proj`` [E, 2I, H],
``down_proj`` [E, H, I]) and saves them per expert, the hub's layout; import takes either,
export writes the per-expert one (Qwen3-MoE's ``ExpertLayout``)."""

from __future__ import annotations

from ...hf.errors import ConversionError
from ...hf.families import Family, Flags
from ...hf.layouts import CAUSAL_LM
from ...hf.mapping import Rule, prefixed
from ...hf.tables import LAYER
from ...hf.transforms import GATE_UP
from ..qwen3_5 import hf as qwen3_5
from ..qwen3_moe.hf import MOE_LAYER, ExpertLayout

ARCH = "Qwen3_5MoeForConditionalGeneration"
_SHARED = "layers.{i}.mlp.shared_expert."
SHARED_EXPERT = (
    Rule(LAYER + "mlp.shared_experts.linear_fc1.weight",
         (_SHARED + "gate_proj.weight", _SHARED + "up_proj.weight"), GATE_UP),
    Rule(LAYER + "mlp.shared_experts.linear_fc2.weight", (_SHARED + "down_proj.weight",)),
    Rule(LAYER + "mlp.shared_experts.gate_weight", ("layers.{i}.mlp.shared_expert_gate.weight",)),
)


def rules(hf_config):
    return (qwen3_5.rules(hf_config)
            + prefixed(MOE_LAYER + SHARED_EXPERT, "language_model.", "model.language_model."))


def moe_flags(text, where: str = "text_config.") -> Flags:
    """Every layer an MoE layer, softmax top-k renormalised (transformers' Qwen3.5-MoE
    router always renormalises), the gated shared expert."""
    if not text.num_experts:
        raise ConversionError(f"config {where}num_experts={text.num_experts!r} is not a "
                              "mixture of experts: convert it as "
                              "Qwen3_5ForConditionalGeneration")
    if not text.shared_expert_intermediate_size:
        raise ConversionError(f"config {where}shared_expert_intermediate_size="
                              f"{text.shared_expert_intermediate_size!r} is not supported: "
                              "Qwen3.5-MoE's layers have a gated shared expert")
    return {"num_experts": text.num_experts,
            "moe_ffn_hidden_size": text.moe_intermediate_size,
            "moe_router_topk": text.num_experts_per_tok,
            "moe_router_pre_softmax": False,
            "moe_layer_freq": 1,
            "moe_shared_expert_intermediate_size": text.shared_expert_intermediate_size,
            "moe_shared_expert_gate": True}


def model_flags(hf_config) -> Flags:
    return {**qwen3_5.model_flags(hf_config), **moe_flags(hf_config.get_text_config())}


# Qwen3.5's text model with MoE layers.
TEXT_MODELS = {"qwen3_5_moe_text": qwen3_5.TEXT_MODELS["qwen3_5_text"]}

ARCHITECTURES = {ARCH: Family(
    ARCH, ExpertLayout(aliases=CAUSAL_LM.aliases, export=CAUSAL_LM.export), rules, True,
    unused=qwen3_5.UNUSED, inputs=qwen3_5.INPUTS, flags=model_flags, config_rules=True,
    media=qwen3_5.qwen3_vl.megatron_media, positions=qwen3_5.qwen3_vl.position_ids,
    hf_inputs=qwen3_5.qwen3_vl.hf_inputs, file_flags=qwen3_5.qwen3_vl.processor_flags)}

"""Qwen3MoeForCausalLM for the converter: the shared LLM table plus the MoE layers'
router and experts, the MoE flags from the config, and the experts' on-disk layouts.

transformers 5 holds an MoE layer's experts as fused ``mlp.experts.gate_up_proj``
[E, 2I, H] and ``mlp.experts.down_proj`` [E, H, I] and saves them per expert
(``mlp.experts.<e>.{gate,up,down}_proj.weight``, the hub's layout); import takes either,
export writes the per-expert one.
"""

from __future__ import annotations

from typing import Dict, List, Mapping

from ...hf.errors import ConversionError
from ...hf.families import Family, Flags, TextModel, causal_lm_flags
from ...hf.layouts import Layout
from ...hf.mapping import Rule, prefixed
from ...hf.tables import LANGUAGE, LAYER, OUTPUT_LAYER
from ...hf.transforms import GATE_UP

ARCH = "Qwen3MoeForCausalLM"
_EXPERT = LAYER + "mlp.experts.local_experts.{e}."  # Megatron-Core's SequentialMLP
_HF_EXPERT = "layers.{i}.mlp.experts.{e}."
MOE_LAYER = (
    Rule(LAYER + "mlp.router.weight", ("layers.{i}.mlp.gate.weight",)),
    Rule(_EXPERT + "linear_fc1.weight",
         (_HF_EXPERT + "gate_proj.weight", _HF_EXPERT + "up_proj.weight"), GATE_UP),
    Rule(_EXPERT + "linear_fc2.weight", (_HF_EXPERT + "down_proj.weight",)),
)


def moe_rules():
    return (prefixed(LANGUAGE + MOE_LAYER, "language_model.", "model.")
            + prefixed(OUTPUT_LAYER, "language_model.", ""))


def sparse_layers(text) -> List[int]:
    """Hugging Face's rule: layer i is an MoE layer unless listed in ``mlp_only_layers``,
    when ``(i + 1) % decoder_sparse_step == 0``; one 0/1 per layer (--moe-layer-freq)."""
    dense = set(text.mlp_only_layers or ())
    step = text.decoder_sparse_step
    return [int(i not in dense and (i + 1) % step == 0) for i in range(text.num_hidden_layers)]


def expert_flags(text, dense: str, where: str = "", renormalise: bool = True) -> Flags:
    """The MoE architecture's flags of a Qwen3-MoE text config: softmax top-k routing,
    renormalised over the top-k (``renormalise``) or not (``--moe-router-pre-softmax``),
    the layer pattern. Training choices stay the run's own: the aux loss
    (``router_aux_loss_coef`` is ``--moe-aux-loss-coeff``, Megatron-Core's per-layer GShard
    loss) and the dispatcher. ``dense``: the architecture of the model without experts."""
    if not text.num_experts:
        raise ConversionError(f"config {where}num_experts=0 is not a mixture of experts: "
                              f"convert it as {dense}")
    return {"num_experts": text.num_experts,
            "moe_ffn_hidden_size": text.moe_intermediate_size,
            "moe_router_topk": text.num_experts_per_tok,
            "moe_router_pre_softmax": not renormalise,
            "moe_layer_freq": sparse_layers(text)}


def moe_flags(hf_config) -> Flags:
    """The LLM's flags and the MoE architecture's (``norm_topk_prob``: renormalised)."""
    return {**causal_lm_flags(hf_config),
            **expert_flags(hf_config, "Qwen3ForCausalLM",
                           renormalise=hf_config.norm_topk_prob)}


class ExpertLayout(Layout):
    """Fused expert tensors (transformers 5's in-memory names) split per expert."""

    def normalise(self, tensors: Mapping) -> Dict:
        out = {}
        for name, t in super().normalise(tensors).items():
            head, fused, kind = name.rpartition(".mlp.experts.")
            if not fused or kind not in ("gate_up_proj", "down_proj"):
                out[name] = t
                continue
            for e, weight in enumerate(t):
                prefix = f"{head}.mlp.experts.{e}."
                if kind == "down_proj":
                    out[prefix + "down_proj.weight"] = weight.contiguous()
                else:
                    gate, up = weight.chunk(2, dim=0)
                    out[prefix + "gate_proj.weight"] = gate.contiguous()
                    out[prefix + "up_proj.weight"] = up.contiguous()
        return out


ARCHITECTURES = {ARCH: Family(ARCH, ExpertLayout(aliases=(), export=()), moe_rules, False,
                              flags=moe_flags)}
TEXT_MODELS = {"qwen3_moe": TextModel(flags=("qk_layernorm",))}

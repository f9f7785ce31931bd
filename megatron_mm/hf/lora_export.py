"""LoRA adapters out to Hugging Face: a PEFT adapter for the base model the checkpoint was
imported from (``adapter_config.json`` + ``adapter_model.safetensors``), or the adapters
merged into the base weights.

Each adapter's (A, B) pairs are already PEFT's, one per Hugging Face projection
(``models/lora.py``); the family's weight table names the projection each Megatron-Core
linear came from. Where Hugging Face fuses what the adapter keeps apart (Qwen2.5-VL's
vision ``qkv``), the pairs become one LoRA of rank ``parts x r``: A stacked, B block
diagonal (rows [q; k; v], the fused layout), its alpha scaled alike so alpha / r stays.
Merging adds ``adapter.delta`` of the identity, the very forward the model trains with,
so the fused layouts come out as the model computes them.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Tuple

import torch

from ..models.lora import SUFFIX, lora_adapters
from .errors import ConversionError
from .mapping import MappingTable
from .safetensors_io import write_weights

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _base_of(model, adapter_name: str):
    parent_name, _, own = adapter_name.rpartition(".")
    return model.get_submodule(parent_name), own[:-len(SUFFIX)]


def peft_tensors(model, table: MappingTable, lora) -> Tuple[Dict[str, torch.Tensor], List[str],
                                                             Dict[str, int], Dict[str, float]]:
    """PEFT's adapter tensors (``base_model.model.<module>.lora_A.weight`` ...), the
    modules they adapt (Hugging Face names), and the rank / alpha patterns of fused ones."""
    tensors, targets, ranks, alphas = {}, [], {}, {}
    for name, adapter in lora_adapters(model):
        parent, base = _base_of(model, name)
        rule, groups = table.rule_for(f"{name[:-len(SUFFIX)]}.weight")
        hf = [h.format(**groups) for h in rule.hf]
        pairs = [getattr(adapter, p) for p in adapter.parts]
        if len(hf) == len(pairs):  # one Hugging Face projection per pair
            chosen = [(h, p) for h, part, p in zip(hf, adapter.parts, pairs)
                      if part in adapter.trained]
            items = [(h, p.lora_A, p.lora_B) for h, p in chosen]
        elif len(hf) == 1:  # fused there too: one LoRA of rank parts x r
            items = [(hf[0], torch.cat([p.lora_A for p in pairs]),
                      torch.block_diag(*[p.lora_B for p in pairs]))]
            module = hf[0][:-len(".weight")]
            ranks[module] = lora.rank * len(pairs)
            alphas[module] = lora.alpha * len(pairs)
        else:
            raise ConversionError(f"{name}: {len(pairs)} LoRA projections for the Hugging "
                                  f"Face tensors {hf}; export with --merge-lora")
        for weight, a, b in items:
            module = weight[:-len(".weight")]
            tensors[f"base_model.model.{module}.lora_A.weight"] = a.detach().float().clone()
            tensors[f"base_model.model.{module}.lora_B.weight"] = b.detach().float().clone()
            targets.append(module)
    return tensors, targets, ranks, alphas


def fully_trained(config) -> List[str]:
    """The model's modules (``MultimodalModel`` attributes) that trained whole: neither
    frozen nor adapted (``config``: the MultimodalModelConfig)."""
    adapted, freeze = config.lora.modules(), config.freeze
    tops = [] if freeze.language_model else ["language_model"]
    for name in config.encoders:
        tops += [] if name in freeze.encoders else [f"{name}_model"]
        tops += [] if name in freeze.projectors else [f"{name}_projection"]
    return [t for t in tops if t not in adapted]


def saved_modules(model, table: MappingTable, ctx, tops) -> Dict[str, torch.Tensor]:
    """PEFT's ``modules_to_save`` tensors of the modules ``tops``: their Hugging Face
    tensors under ``base_model.model.``."""
    mine = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)
            and k.split(".")[0] in tops and ".lora_" not in k}
    return {f"base_model.model.{k}": v.detach().float().clone()
            for k, v in table.to_hf(mine, ctx).items()}


def write_peft_adapter(model, table: MappingTable, config, ctx, base: str,
                       out_dir: str) -> str:
    """``out_dir`` with the PEFT adapter of ``model``'s adapters for the Hugging Face model
    ``base`` (its name or directory, as ``base_model_name_or_path``); modules that trained
    whole (a projector next to the LLM's adapters) as PEFT's ``modules_to_save``
    (``config``: the MultimodalModelConfig, ``ctx``: the export's transform context)."""
    lora = config.lora
    tensors, targets, ranks, alphas = peft_tensors(model, table, lora)
    whole = saved_modules(model, table, ctx, fully_trained(config))
    tensors.update(whole)
    owners = {k[len("base_model.model."):].rpartition(".")[0] for k in whole}
    # the outermost owners only: PEFT copies a module whole (an embeddings module holding
    # a tensor of its own and child modules is one entry)
    to_save = sorted(m for m in owners if not any(m.startswith(o + ".") for o in owners))
    config = {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base,
              "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
              "target_modules": sorted(targets), "rank_pattern": ranks,
              "alpha_pattern": alphas, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "use_dora": False, "init_lora_weights": True,
              "modules_to_save": to_save or None, "inference_mode": True}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    write_weights(tensors, out_dir, ADAPTER_WEIGHTS)
    return out_dir


@torch.no_grad()
def merge_adapters(model) -> None:
    """Add each adapter's product into its base weight (at TP = 1, the export's world)."""
    model.eval()  # no adapter dropout
    for name, adapter in lora_adapters(model):
        parent, base_name = _base_of(model, name)
        weight = getattr(parent, base_name).weight
        eye = torch.eye(weight.shape[1], dtype=torch.float32, device=weight.device)
        weight.add_(adapter(eye).t().to(weight.dtype))

"""Hugging Face checkpoint <-> megatron_mm distributed checkpoint.

Import builds the whole megatron_mm model at TP = PP = 1 (in a one-rank world, see
``world.py``), fills it through the family's weight table and saves it with the training
script's own ``save_checkpoint``: iteration 0, weights only, and the model's flags in the
saved args, so ``examples/pretrain_mllm.py --load`` rebuilds it at any TP / PP (the
distributed checkpoint reshards). Everything else of the Hugging Face directory (config,
tokenizer, image processor, tensors the model does not use) is carried in ``<save>/hf/``;
export reads it back to write a directory transformers loads. The checkpoint carries
Transformer Engine's tensor names (``models/te_names.py``), so the import trains with either
``--transformer-impl`` and export reads a checkpoint trained with either.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, List

import torch

from ..config import ConfigError, MultimodalModelConfig
from ..models.lora import is_lora_parameter
from .errors import ConversionError
from .families import Family, Flags, family_for, model_flags
from .lora_export import merge_adapters, write_peft_adapter
from .mapping import MappingTable
from .safetensors_io import read_weights, write_weights
from .transforms import Context

HF_SUBDIR = "hf"  # training.hf_sidecar.SIDECAR: a run carries it to its --save directory
UNUSED = "unused.safetensors"
# What import noted of the files' layout (Layout.recorded), for export; not copied out.
RECORDED = "converted_layout.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json", ".msgpack", ".h5")


def _hf_config(directory: str):
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ConversionError(f"{directory}: no config.json (not a Hugging Face model "
                              f"directory)")
    return AutoConfig.from_pretrained(directory)


def _run_config(flags: Flags):
    """The training script's RunConfig of ``flags`` (the typed groups' defaults for the
    rest; with ``load``, the architecture its checkpoint saved), validated as the command
    line is, without exiting on a bad flag."""
    from ..training.config.values import checkpoint_values, run_config_of

    saved = checkpoint_values(flags.get("load"), flags)
    return run_config_of(flags, saved).validated(world_size=1)


def _context(config: MultimodalModelConfig, vocab_size: int) -> Context:
    lm = config.language
    heads = {"language": (lm.num_attention_heads, lm.num_query_groups)}
    for name, enc in config.encoders.items():
        heads[name] = (enc.num_attention_heads, enc.num_attention_heads)
    return Context(heads=heads, vocab_size=vocab_size,
                   padded_vocab_size=lm.padded_vocab_size)


def _build(config: MultimodalModelConfig, model):
    """``model``: the RunConfig's model group."""
    from ..models import BuildSettings, build_model

    return build_model(config, BuildSettings(transformer_impl="local"),
                       media_token_ids(config, model))


def media_token_ids(config: MultimodalModelConfig, model) -> Dict[str, int]:
    """Modality -> placeholder id, from ``--{modality}-token-id`` (the converted config's;
    ``model``: the RunConfig's model group)."""
    from ..families import modalities_of

    modalities = [m for enc in config.encoders.values() for m in modalities_of(enc)]
    return {m: getattr(model, f"{m}_token_id") for m in modalities}


def _tensors(model) -> Dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}


def check_tensor_parallel(config: MultimodalModelConfig, tp: int) -> None:
    groups = config.language.num_query_groups
    if groups % tp:
        raise ConversionError(
            f"--tensor-model-parallel-size {tp} does not divide the {groups} key/value "
            f"heads (num_key_value_heads): each TP rank must hold whole key/value groups")
    try:
        config.validate_parallel(tp)
    except ConfigError as e:
        raise ConversionError(str(e)) from None


def _carry_files(src: str, dst: str) -> List[str]:
    os.makedirs(dst, exist_ok=True)
    names = [n for n in sorted(os.listdir(src))
             if os.path.isfile(os.path.join(src, n)) and not n.endswith(_WEIGHT_SUFFIXES)]
    for name in names:
        shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    return names


def _data_flags(carried: List[str]) -> Flags:
    """Tokenizer and image processor of the Hugging Face directory, relative to the
    checkpoint root (the loader resolves them against --load)."""
    flags = {}
    if "tokenizer.model" in carried:  # SentencePiece (Llama / Mistral): literal encoding
        flags.update(tokenizer_type="SentencePiece",
                     tokenizer_model=os.path.join(HF_SUBDIR, "tokenizer.model"))
    elif "tokenizer.json" in carried:
        flags.update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=HF_SUBDIR)
    if "preprocessor_config.json" in carried:
        flags["image_processor_config"] = os.path.join(HF_SUBDIR, "preprocessor_config.json")
    return flags


def _leftovers(hf: Dict[str, torch.Tensor], used: set, family: Family,
               tied: bool) -> Dict[str, torch.Tensor]:
    import re

    rest = {k: v for k, v in hf.items() if k not in used}
    if tied and "lm_head.weight" in rest:  # transformers' in-memory copy of the embedding
        embed = next(v for k, v in hf.items() if k.endswith("embed_tokens.weight"))
        if not torch.equal(rest.pop("lm_head.weight"), embed):
            raise ConversionError("lm_head.weight differs from embed_tokens.weight but "
                                  "tie_word_embeddings=True")
    patterns = [re.compile(p) for p in family.unused]
    bad = [k for k in rest if not any(p.fullmatch(k) for p in patterns)]
    if bad:
        raise ConversionError(f"no place in the megatron_mm model for {', '.join(bad[:5])}"
                              f" ({family.architecture}); an unsupported option?")
    return rest


def import_hf(hf_dir: str, save_dir: str, tensor_model_parallel_size: int = 1,
              make_vocab_size_divisible_by: int = 128) -> str:
    """Convert ``hf_dir`` into a checkpoint under ``save_dir``; returns its iteration
    directory. Runs in a Megatron world with TP = PP = 1. ``tensor_model_parallel_size``
    is the largest TP the checkpoint will be loaded at (vocabulary padding, divisibility)."""
    from ..training.checkpoint.checkpointing import save_checkpoint

    hf_config = _hf_config(hf_dir)
    family = family_for(hf_config)
    text = hf_config.get_text_config()
    flags = model_flags(hf_config)
    if family.file_flags is not None:
        flags.update(family.file_flags(hf_dir, hf_config))
    longest = flags["max_position_embeddings"]  # sliding window
    on_disk = read_weights(hf_dir)
    recorded = family.layout.recorded(on_disk)
    hf = family.layout.normalise(on_disk)
    del on_disk
    carried = _carry_files(hf_dir, os.path.join(save_dir, HF_SUBDIR))
    run = _run_config({**flags, **_data_flags(carried),
                       "make_vocab_size_divisible_by": make_vocab_size_divisible_by,
                       "seq_length": min(128, longest), "save": save_dir,
                       "no_save_optim": True, "no_save_rng": True, "train_iters": 0})
    config = run.model_config
    check_tensor_parallel(config, tensor_model_parallel_size)
    lm = config.language
    lm.vocab_size = text.vocab_size
    lm.padded_vocab_size = lm.vocab_size_padded(tensor_model_parallel_size)
    model = _build(config, run.model)
    expected = _tensors(model)
    mapped, used = MappingTable(family.table(hf_config)).to_megatron(hf, expected,
                                                             _context(config, text.vocab_size))
    unused = _leftovers(hf, used, family, tied=not lm.untie_embeddings_and_output_weights)
    model.load_state_dict({**model.state_dict(), **mapped}, strict=True)
    path = save_checkpoint(run, 0, [model], None, None,
                           run_state={"padded_vocab_size": lm.padded_vocab_size})
    if torch.distributed.get_rank() == 0:
        if unused:
            write_weights(unused, os.path.join(save_dir, HF_SUBDIR), UNUSED)
        if recorded:
            with open(os.path.join(save_dir, HF_SUBDIR, RECORDED), "w") as f:
                json.dump(recorded, f, indent=1)
    return path


def export_hf(load_dir: str, out_dir: str, lora: str = None) -> str:
    """Write the checkpoint under ``load_dir`` (its latest iteration) as a Hugging Face
    directory ``out_dir``; one with LoRA adapters as a PEFT adapter for its base
    (``lora="adapter"``) or merged into the weights (``lora="merge"``). Runs in a Megatron
    world with TP = PP = 1."""
    from ..training.checkpoint.checkpointing import load_checkpoint, saved_args

    hf_dir = os.path.join(load_dir, HF_SUBDIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise ConversionError(f"--load {load_dir}: no {HF_SUBDIR}/config.json; export needs "
                              f"a checkpoint written by `convert_hf.py import` (or by a "
                              f"run that --load-ed one)")
    hf_config = _hf_config(hf_dir)
    family = family_for(hf_config)
    text = hf_config.get_text_config()
    run = _run_config({"load": load_dir, "no_load_optim": True, "no_load_rng": True})
    config = run.model_config
    config.language.vocab_size = text.vocab_size
    config.language.padded_vocab_size = saved_args(run.checkpoint).get("padded_vocab_size")
    model = _build(config, run.model)
    load_checkpoint(run, [model], None, None)
    table = MappingTable(family.table(hf_config))
    if config.lora is None and lora is not None:
        raise ConversionError(f"--load {load_dir} holds no LoRA adapters (trained without "
                              f"--lora-rank): export it without --lora-adapter / --merge-lora")
    if config.lora is not None:
        if lora is None:
            raise ConversionError(f"--load {load_dir} holds LoRA adapters: pass "
                                  f"--lora-adapter (a PEFT adapter for its base model) or "
                                  f"--merge-lora (the merged weights)")
        if lora == "adapter":
            return write_peft_adapter(model, table, config, _context(config, text.vocab_size),
                                      hf_config._name_or_path or hf_dir, out_dir)
        merge_adapters(model)
    hf = table.to_hf({k: v for k, v in _tensors(model).items() if not is_lora_parameter(k)},
                     _context(config, text.vocab_size))
    unused = os.path.join(hf_dir, UNUSED)
    if os.path.isfile(unused):
        hf.update(read_weights_file(unused))
    dtype = getattr(hf_config, "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    record = os.path.join(hf_dir, RECORDED)
    recorded = json.load(open(record)) if os.path.isfile(record) else None
    on_disk = family.layout.written({k: v.to(dtype) for k, v in hf.items()}, recorded)
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(hf_dir):
        if name not in (UNUSED, RECORDED):
            shutil.copy2(os.path.join(hf_dir, name), os.path.join(out_dir, name))
    write_weights(on_disk, out_dir)
    return out_dir


def read_weights_file(path: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path)

"""Public model sizes: the encoders and LLMs of Cornstarch's nine MLLMs, and Optimus' models.

Sizes are those of the public checkpoints (Hugging Face ``config.json`` or the paper named
on each entry). Cornstarch's benchmark harness (``cornstarch/testing/model_zoo.py``, wheel
0.0.5) loads the same configs but trims Llama-3.1-70B and Qwen2.5-72B to 40 layers and
InternViT-6B to 3072 wide / 24 heads to fit its GPUs; the public sizes are used here.

Media tokens follow the harness: an image of ``img_h`` x ``img_w`` is cut into tiles of the
encoder's native resolution (ceil(H / s) x ceil(W / s) tiles, each (s / patch)^2 patches,
plus a class token where the model has one); Pixtral and Qwen2-VL see the image at (near)
native resolution instead; audio runs in 30 s clips of 1500 encoder frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..plan.errors import PlanError
from ..plan.model import (EncoderSpec, LinearAttentionSpec, ModelSpec, TransformerSpec,
                          linear_attention_pattern, patch_embed_flops, whisper_stem_flops)


def _llm(hidden, layers, ffn, heads, groups, vocab, **kw) -> TransformerSpec:
    return TransformerSpec(hidden_size=hidden, num_layers=layers, ffn_hidden_size=ffn,
                           num_attention_heads=heads, num_query_groups=groups,
                           gated_linear_unit=kw.pop("gated", True), vocab_size=vocab, **kw)


LLMS: Dict[str, TransformerSpec] = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": _llm(4096, 32, 14336, 32, 8, 128256),
    # meta-llama/Llama-3.1-70B config.json
    "llama-3.1-70b": _llm(8192, 80, 28672, 64, 8, 128256),
    # Qwen/Qwen2.5-7B config.json
    "qwen2.5-7b": _llm(3584, 28, 18944, 28, 4, 152064),
    # Qwen/Qwen2.5-14B config.json (Cornstarch's "qwen2_14b")
    "qwen2.5-14b": _llm(5120, 48, 13824, 40, 8, 152064),
    # Qwen/Qwen2.5-72B config.json (Cornstarch's "qwen2_72b")
    "qwen2.5-72b": _llm(8192, 80, 29568, 64, 8, 152064),
    # mistralai/Mistral-7B-v0.3 config.json
    "mistral-7b-v0.3": _llm(4096, 32, 14336, 32, 8, 32768),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, top-2 routing
    "mixtral-8x7b": _llm(4096, 32, 14336, 32, 8, 32000, num_experts=8, moe_router_topk=2),
    # google/gemma-2-27b config.json: head_dim 128, so 32 heads span 4096 < hidden 4608
    "gemma-2-27b": _llm(4608, 46, 36864, 32, 16, 256000, kv_channels=128),
    # internlm/internlm2_5-20b config.json
    "internlm2.5-20b": _llm(6144, 48, 16384, 48, 8, 92544),
    # microsoft/Phi-3-small-8k-instruct config.json (GeGLU)
    "phi-3-small": _llm(4096, 32, 14336, 32, 8, 100352),
    # Qwen/Qwen3.5-27B (Megatron-Bridge's Qwen35VLModelProvider, qwen35_vl_provider.py):
    # 64 layers, 3 Gated DeltaNet (16 key / 48 value heads of 128, conv 4) then 1 gated
    # full attention (24 heads, 4 KV groups of 256) in turn, MLP 17408, vocabulary 248320
    "qwen3.5-27b": _llm(5120, 64, 17408, 24, 4, 248320, kv_channels=256,
                        attention_output_gate=True,
                        linear_attention=LinearAttentionSpec(linear_num_value_heads=48),
                        linear_attention_freq=linear_attention_pattern(4, 64)),
    # Optimus (ATC'25) Table 9 / DESIGN.md: LLaMA-70B 8192/80/64 heads; FFN, GQA and vocab
    # of meta-llama/Llama-2-70b
    "llama-2-70b": _llm(8192, 80, 28672, 64, 8, 32000),
    # Optimus Table 9: GPT-11B 3072/80/24 heads; GPT-3 style 4h GELU MLP, 51200 vocab
    "gpt-11b": _llm(3072, 80, 12288, 24, 24, 51200, gated=False, add_bias_linear=True),
    # Optimus Table 9 / Brown et al. 2020: GPT-175B 12288/96/96 heads
    "gpt-175b": _llm(12288, 96, 49152, 96, 96, 51200, gated=False, add_bias_linear=True),
}


@dataclass(frozen=True)
class VisionEntry:
    transformer: TransformerSpec
    patch: int
    image: int  # native tile side
    class_token: bool
    resize: str = "tile"  # tile | pixtral | qwen2vl
    source: str = ""


def _vit(hidden, layers, ffn, heads, bias=True, gated=False) -> TransformerSpec:
    return TransformerSpec(hidden_size=hidden, num_layers=layers, ffn_hidden_size=ffn,
                           num_attention_heads=heads, add_bias_linear=bias,
                           gated_linear_unit=gated)


VISION: Dict[str, VisionEntry] = {
    "clip-vit-l-14-336": VisionEntry(_vit(1024, 24, 4096, 16), 14, 336, True,
                                     source="openai/clip-vit-large-patch14-336"),
    "siglip-so400m-14-384": VisionEntry(_vit(1152, 27, 4304, 16), 14, 384, False,
                                        source="google/siglip-so400m-patch14-384 "
                                               "(Cornstarch's siglip_878m)"),
    "vit-22b": VisionEntry(_vit(6144, 48, 24576, 48, bias=False), 14, 448, True,
                           source="Dehghani et al. 2023; 448 px and HF ViTModel's class "
                                  "token as in Cornstarch's harness"),
    "eva-clip-18b": VisionEntry(_vit(5120, 48, 20480, 40, bias=False), 14, 448, True,
                                source="BAAI/EVA-CLIP-18B (Sun et al. 2024: 5120 wide, 48 deep, "
                                       "MLP 20480, 40 heads), 448 px as in Cornstarch's "
                                       "harness; a plain MLP gives 15.1B of the quoted 17.5B"),
    "internvit-6b-448px-v1.5": VisionEntry(_vit(3200, 45, 12800, 25), 14, 448, True,
                                           source="OpenGVLab/InternViT-6B-448px-V1-5"),
    "qwen2-vl-vision-675m": VisionEntry(_vit(1280, 32, 5120, 16), 14, 0, False, "qwen2vl",
                                        source="Qwen/Qwen2-VL-7B-Instruct vision_config"),
    # Qwen3-VL's ViT without DeepStack (Megatron-Bridge's Qwen35VLModelProvider: depth
    # 27, hidden 1152; transformers' Qwen3_5VisionConfig: MLP 4304, 16 heads, patch 16
    # over 2 frames, 2 x 2 patches merged per LLM token)
    "qwen3.5-vision": VisionEntry(_vit(1152, 27, 4304, 16), 16, 0, False, "qwen2vl",
                                  source="Qwen/Qwen3.5-27B vision_config"),
    "pixtral-400m": VisionEntry(_vit(1024, 24, 4096, 16, bias=False, gated=True), 16, 1024,
                                False, "pixtral", source="mistral-community/pixtral-12b "
                                                         "vision_config"),
    # Optimus Table 8: scaled-down ViT-22B (head dim 128), 448 px tiles here
    "vit-3b": VisionEntry(_vit(2304, 48, 9216, 18, bias=False), 14, 448, True,
                          source="Optimus Table 8"),
    "vit-5b": VisionEntry(_vit(3072, 48, 12288, 24, bias=False), 14, 448, True,
                          source="Optimus Table 8"),
    "vit-11b": VisionEntry(_vit(4096, 48, 16384, 32, bias=False), 14, 448, True,
                           source="Optimus Table 8"),
    # ViT-22B / ViT-3B at ViT-22B's own pre-training resolution (Dehghani et al. 2023:
    # 224 px, patch 14, no class token): 256 tokens per image, as the Optimus runs assume
    "vit-22b-224": VisionEntry(_vit(6144, 48, 24576, 48, bias=False), 14, 224, False,
                               source="Dehghani et al. 2023 / Optimus Table 8, 224 px"),
    "vit-3b-224": VisionEntry(_vit(2304, 48, 9216, 18, bias=False), 14, 224, False,
                              source="Optimus Table 8, 224 px"),
}


@dataclass(frozen=True)
class AudioEntry:
    transformer: TransformerSpec
    mel_bins: int
    pool: int = 1  # Qwen2-Audio average-pools the 1500 frames by 2 before the projector
    source: str = ""


AUDIO: Dict[str, AudioEntry] = {
    "whisper-small": AudioEntry(_vit(768, 12, 3072, 12), 80,
                                source="openai/whisper-small (Cornstarch's whisper_242m)"),
    "whisper-medium": AudioEntry(_vit(1024, 24, 4096, 16), 80,
                                 source="openai/whisper-medium (Cornstarch's whisper_307m)"),
    "whisper-large-v3": AudioEntry(_vit(1280, 32, 5120, 20), 128,
                                   source="openai/whisper-large-v3 (Cornstarch's "
                                          "whisper_1.5b)"),
    "qwen2-audio-encoder": AudioEntry(_vit(1280, 32, 5120, 20), 128, pool=2,
                                      source="Qwen/Qwen2-Audio-7B-Instruct audio_config"),
}

# name -> (LLM, encoders); Cornstarch's harness (seed-systems.md B.1, profile_4d_parallel.py)
CORNSTARCH_PAIRS: Dict[str, Tuple[str, List[str]]] = {
    "VLM-L": ("qwen2.5-72b", ["vit-22b"]),
    "ALM-L": ("mixtral-8x7b", ["qwen2-audio-encoder"]),
    "VALM-L": ("llama-3.1-70b", ["eva-clip-18b", "whisper-large-v3"]),
    "VLM-M": ("gemma-2-27b", ["internvit-6b-448px-v1.5"]),
    "ALM-M": ("internlm2.5-20b", ["whisper-medium"]),
    "VALM-M": ("qwen2.5-14b", ["qwen2-vl-vision-675m", "whisper-medium"]),
    "VLM-S": ("llama-3.1-8b", ["pixtral-400m"]),
    "ALM-S": ("phi-3-small", ["whisper-small"]),
    "VALM-S": ("mistral-7b-v0.3", ["siglip-so400m-14-384", "whisper-small"]),
}

# Optimus' weak-scaling models A-D (Table 3) and its 8-GPU model
OPTIMUS_PAIRS: Dict[str, Tuple[str, List[str]]] = {
    "Optimus-A": ("llama-2-70b", ["vit-11b"]),
    "Optimus-B": ("llama-2-70b", ["vit-22b"]),
    "Optimus-C": ("gpt-175b", ["vit-11b"]),
    "Optimus-D": ("gpt-175b", ["vit-22b"]),
    "Optimus-small": ("gpt-11b", ["vit-3b"]),
    # the bubble-scheduling runs (strong scaling, Table 5; 8 x A100, Table 10) at 224 px
    "Optimus-D-224": ("gpt-175b", ["vit-22b-224"]),
    "Optimus-small-224": ("gpt-11b", ["vit-3b-224"]),
}

PAIRS = {**CORNSTARCH_PAIRS, **OPTIMUS_PAIRS,
         "LLaVA-1.5-7B-like": ("qwen2.5-7b", ["clip-vit-l-14-336"]),
         # hybrid: Gated DeltaNet layers linear in the sequence, every 4th full attention
         "Qwen3.5-27B": ("qwen3.5-27b", ["qwen3.5-vision"])}


def vision_encoder(name: str, img_h: int = 720, img_w: int = 1280) -> EncoderSpec:
    e = _lookup(VISION, name, "vision encoder")
    t, p = e.transformer, e.patch
    frames, merge = 1, 1
    if e.resize == "tile":
        items = math.ceil(img_h / e.image) * math.ceil(img_w / e.image)
        tokens = (e.image // p) ** 2 + int(e.class_token)
    elif e.resize == "pixtral":  # longest side down to 1024, then 16 px patches
        scale = min(1.0, e.image / max(img_h, img_w))
        items = 1
        tokens = math.ceil(img_h * scale / p) * math.ceil(img_w * scale / p)
    else:  # qwen2vl: sides rounded to multiples of 2 patches, 2x2 merged per LLM token
        items, frames, merge = 1, 2, 4
        tokens = (round(img_h / (2 * p)) * 2) * (round(img_w / (2 * p)) * 2)
    h = t.hidden_size
    return EncoderSpec(
        name="vision", modality="vision", transformer=t, tokens_per_item=tokens,
        llm_tokens_per_item=tokens // merge, items_per_sample=items,
        embed_flops_per_token=patch_embed_flops(p, h, frames=frames),
        embed_params=(3 * frames * p * p + 1) * h + tokens * h + int(e.class_token) * h,
        projector_input_size=h * merge,
        projector_ffn_hidden_size=h * merge if merge > 1 else None)


def audio_encoder(name: str, seconds: float = 30.0) -> EncoderSpec:
    e = _lookup(AUDIO, name, "audio encoder")
    h = e.transformer.hidden_size
    return EncoderSpec(
        name="audio", modality="audio", transformer=e.transformer, tokens_per_item=1500,
        llm_tokens_per_item=1500 // e.pool, items_per_sample=max(1, math.ceil(seconds / 30)),
        embed_flops_per_token=whisper_stem_flops(e.mel_bins, h),
        embed_params=3 * e.mel_bins * h + 3 * h * h + 2 * h + 1500 * h)


def model_pair(name: str, img_h: int = 720, img_w: int = 1280,
               audio_seconds: float = 30.0) -> ModelSpec:
    """A zoo MLLM, nothing frozen (apply ``ModelSpec.with_freeze``)."""
    llm_name, encoders = _lookup(PAIRS, name, "model pair")
    llm = LLMS[llm_name]
    specs = [vision_encoder(e, img_h, img_w) if e in VISION else audio_encoder(e, audio_seconds)
             for e in encoders]
    return ModelSpec(name=f"{name} ({' + '.join(encoders)} + {llm_name})", encoders=specs,
                     llm=llm)


def _lookup(table, name, what):
    try:
        return table[name]
    except KeyError:
        raise PlanError(f"unknown {what} {name!r}; known: {', '.join(table)}") from None

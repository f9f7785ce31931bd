"""Tiny random-weight Hugging Face models, built from configs (no hub), one per detail a
converter can get wrong, and reference logits computed with transformers itself."""

from __future__ import annotations

import torch

VOCAB = 250  # not a multiple of 128: the vocabulary gets padded
IMAGE_TOKEN = 249
IMG, PATCH = 28, 14  # 4 patches

_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, image_size=IMG, patch_size=PATCH)

# RoPE scaling. llama3 with a base whose frequencies fall in all three of its bands
# (kept, smoothed, divided by the factor); YaRN's ramp spans dims 0-3 of 8 with a short
# original context (64), and its test sequences are longer (SEQ).
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA3_LONGEST = 8192 + 64
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
             "original_max_position_embeddings": 64}
SEQ = {"llava_qwen2_yarn": 96}

# name -> (architecture, text model type, text overrides, vision type, vision overrides,
#          top-level overrides)
MODELS = {
    # grouped-query attention, untied output layer, RoPE base 500000
    "llama": ("LlamaForCausalLM", "llama",
              dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                               "rope_theta": 5e5}),
              None, None, {}),
    # tied embeddings
    "mistral": ("MistralForCausalLM", "mistral", dict(tie_word_embeddings=True), None, None, {}),
    # QKV bias, tied
    "qwen2": ("Qwen2ForCausalLM", "qwen2", dict(tie_word_embeddings=True), None, None, {}),
    # q/k norm and a head dim that is not hidden / heads
    "qwen3": ("Qwen3ForCausalLM", "qwen3", dict(head_dim=32, tie_word_embeddings=False),
              None, None, {}),
    # mixture of experts: layer 0 sparse (4 experts, top-2 renormalised), layer 1 dense
    # (mlp_only_layers); experts narrower than the dense MLP
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe",
                  dict(head_dim=32, tie_word_embeddings=False, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                       mlp_only_layers=[1]), None, None, {}),
    # the other router (top-k of the softmax over all experts, not renormalised) and
    # decoder_sparse_step 2: layer 0 dense, layer 1 sparse
    "qwen3_moe_step": ("Qwen3MoeForCausalLM", "qwen3_moe",
                       dict(tie_word_embeddings=True, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=32, norm_topk_prob=False,
                            decoder_sparse_step=2), None, None, {}),
    # LLaVA-1.5: CLIP, feature layer -2, class token dropped ("default")
    "llava_llama": ("LlavaForConditionalGeneration", "llama", dict(tie_word_embeddings=False),
                    "clip_vision_model", {}, dict(vision_feature_layer=-2)),
    "llava_mistral": ("LlavaForConditionalGeneration", "mistral",
                      dict(tie_word_embeddings=False), "clip_vision_model", {},
                      dict(vision_feature_layer=-2)),
    # class token kept ("full"), last layer, Qwen2 LLM with QKV bias
    "llava_qwen2": ("LlavaForConditionalGeneration", "qwen2", dict(tie_word_embeddings=False),
                    "clip_vision_model", {},
                    dict(vision_feature_layer=-1, vision_feature_select_strategy="full")),
    # Llama 3.1's RoPE scaling (llama3: Megatron-Core's constants; test_convert also runs
    # a sequence past its original context) and long-context Qwen2's YaRN
    "llava_llama3": ("LlavaForConditionalGeneration", "llama",
                     dict(tie_word_embeddings=False, max_position_embeddings=LLAMA3_LONGEST,
                          rope_parameters=LLAMA3_ROPE),
                     "clip_vision_model", {}, dict(vision_feature_layer=-2)),
    "llava_qwen2_yarn": ("LlavaForConditionalGeneration", "qwen2",
                         dict(tie_word_embeddings=False, rope_parameters=YARN_ROPE),
                         "clip_vision_model", {}, dict(vision_feature_layer=-2)),
    # LLaVA-OneVision: SigLIP + Qwen2, one tile (no any-resolution tiling)
    "onevision": ("LlavaOnevisionForConditionalGeneration", "qwen2",
                  dict(tie_word_embeddings=True), "siglip_vision_model", {},
                  dict(vision_feature_layer=-1, vision_feature_select_strategy="full")),
}


def build(name: str, seed: int = 0, vocab_size: int = VOCAB, image_token: int = IMAGE_TOKEN):
    import transformers
    from transformers import AutoConfig

    arch, text_type, text_kw, vision_type, vision_kw, top_kw = MODELS[name]
    text = AutoConfig.for_model(text_type, **{**_TEXT, **text_kw, "vocab_size": vocab_size})
    if vision_type is None:
        config = text
    else:
        vision = AutoConfig.for_model(vision_type, **{**_VISION, **vision_kw})
        model_type = "llava_onevision" if "Onevision" in arch else "llava"
        config = AutoConfig.for_model(model_type, text_config=text.to_dict(),
                                      vision_config=vision.to_dict(),
                                      image_token_index=image_token, **top_kw)
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    # random norms, biases and routers: a mapping mix-up cannot hide
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias") or "layrnorm" in n or "mlp.gate." in n:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def image_tokens(name: str) -> int:
    _, _, _, vision_type, _, top_kw = MODELS[name]
    keep_cls = vision_type == "clip_vision_model" and top_kw.get(
        "vision_feature_select_strategy") == "full"
    return (IMG // PATCH) ** 2 + int(keep_cls)


def inputs(name: str, seq: int = None, batch: int = 2, seed: int = 1):
    """Token ids (one image's placeholders after the first token when the model has a
    tower) and pixel values; ``seq`` tokens a sequence (default: the model's ``SEQ``, or
    12)."""
    seq = seq or SEQ.get(name, 12)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, IMAGE_TOKEN, (batch, seq), generator=g)
    pixels = None
    if MODELS[name][3] is not None:
        n = image_tokens(name)
        tokens[:, 1:1 + n] = IMAGE_TOKEN
        pixels = torch.randn(batch, 3, IMG, IMG, generator=g)
    return tokens, pixels


def reference_logits(model, tokens, pixels) -> torch.Tensor:
    from megatron_mm.hf.compare import hf_logits

    inputs = {"input_ids": tokens}
    if pixels is not None:
        inputs["pixel_values"] = pixels
    return hf_logits(model, inputs)


DIGITS_ENGLISH = ("zero one two three four five six seven eight nine digit number shown here "
                  "What is this It a USER ASSISTANT handwritten the")


def digits_tokenizer(directory) -> tuple:
    """A byte-level BPE trained on the digits prompts (tokenizers, offline) saved into
    ``directory`` (tokenizer.json, tokenizer_config.json); returns (the id of <image>,
    the vocabulary size)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<image>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([DIGITS_ENGLISH + " (0123456789)?.\n"] * 4, trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tok.token_to_id("<image>"), tok.get_vocab_size()

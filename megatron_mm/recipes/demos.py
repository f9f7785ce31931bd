"""The demos (``make demo`` ...): tiny models on the built-in handwritten digits, the
Makefile's former flag strings as typed configs. One base (the ViT + Llama-style LLM and
the shared optimiser); the others replace its fields. Any world size (1 or 2 on CPU)."""

from __future__ import annotations

from ..data.digits_tokenizer import MODEL as DIGITS_TOKENIZER
from ..training.config.run_config import RunConfig
from .registry import defaults, recipe, with_family, with_fields


def demo_schedule(config: RunConfig, train_iters: int, eval_interval: int,
                  save: str) -> RunConfig:
    """The demos' optimiser, seed, batch and logging (the Makefile's DEMO_RECIPE): cosine
    from 1e-3 to 1e-5 after 10 warm-up iterations; a checkpoint at the end."""
    config = with_fields(config, "training", micro_batch_size=16, global_batch_size=32,
                         train_iters=train_iters, lr=1e-3, min_lr=1e-5,
                         lr_decay_style="cosine", lr_warmup_iters=10, weight_decay=0.01,
                         clip_grad=1.0, seed=1234)
    config = with_fields(config, "logging", log_interval=50)
    config = with_fields(config, "validation", eval_interval=eval_interval, eval_iters=10)
    return with_fields(config, "checkpoint", save=save, save_interval=train_iters)


@recipe("demo", world_size=2)
def demo() -> RunConfig:
    """CLIP-style ViT + MLP projector + Llama-style LLM on real handwritten digits."""
    config = with_fields(
        defaults(), "model", num_layers=2, hidden_size=128, num_attention_heads=4,
        group_query_attention=True, num_query_groups=2, seq_length=64,
        vision_hidden_size=64, vision_num_layers=2, vision_num_attention_heads=4,
        img_h=16, img_w=16, patch_dim=8, disable_vision_class_token=True)
    return demo_schedule(config, 600, 200, "runs/demo/checkpoints")


@recipe("demo_audio", world_size=2)
def demo_audio() -> RunConfig:
    """The demo's ViT plus a Whisper-style audio encoder: handwritten digits paired with
    digits spoken by espeak-ng ("seven plus three is ten")."""
    config = with_fields(
        demo(), "model", audio_model_type="whisper", audio_hidden_size=64,
        audio_num_layers=2, audio_num_attention_heads=4, audio_num_mel_bins=80,
        audio_max_source_positions=64, audio_pool_stride=4)
    return with_fields(config, "checkpoint", save="runs/demo-audio/checkpoints")


def qwen_llm(config: RunConfig, seq_length: int) -> RunConfig:
    """The Qwen demos' LLM: 8 heads in 4 groups, M-RoPE."""
    return with_fields(config, "model", num_attention_heads=8, num_query_groups=4,
                       seq_length=seq_length, position_embedding_type="mrope",
                       mrope_section=[2, 3, 3])


@recipe("demo_qwen", world_size=2)
def demo_qwen() -> RunConfig:
    """Qwen2.5-VL's ViT (14 px patches, 2x2 merger, window attention) at each image's own
    size + an M-RoPE LLM, on digit images of sides 28-84 px and clips of 2 or 4 frames."""
    config = with_fields(qwen_llm(demo(), 64), "model", vision_model_type="qwen2_5_vl",
                         patch_dim=14, img_h=28, img_w=28,
                         disable_vision_class_token=False)  # the flags' defaults
    config = with_family(config, "qwen2_5_vl", min_pixels=784, max_pixels=7056,
                         video_min_pixels=784, video_max_pixels=3136)
    return demo_schedule(config, 3000, 1000, "runs/demo-qwen/checkpoints")


@recipe("demo_qwen3", world_size=2)
def demo_qwen3() -> RunConfig:
    """Qwen3-VL's ViT (16 px patches, a learned position table) whose layer 0 also feeds
    DeepStack + a Qwen3 LLM (q / k norms) with interleaved M-RoPE, digits in 32 px cells."""
    config = with_fields(qwen_llm(demo_qwen(), 80), "model", qk_layernorm=True,
                         mrope_interleaved=True, vision_model_type="qwen3_vl", patch_dim=16)
    config = with_family(config, "qwen2_5_vl", min_pixels=1024, max_pixels=9216,
                         video_min_pixels=2048, video_max_pixels=16384)
    config = with_family(config, "qwen3_vl", vision_deepstack_visual_indexes=[0],
                         vision_num_position_embeddings=64)
    return demo_schedule(config, 4000, 1000, "runs/demo-qwen3/checkpoints")


@recipe("demo_qwen35", world_size=2)
def demo_qwen35() -> RunConfig:
    """Qwen3-VL's tower without DeepStack + a hybrid LLM (layers 0 and 2 Gated DeltaNet, 1
    and 3 gated full attention rotating a quarter of each head, zero-centred norms), with a
    tokenizer of the digits' text that has Qwen's vision tags (each item between
    ``<|vision_start|>`` and ``<|vision_end|>``; 512 ids, not Mistral's 32,128, whose
    embedding table was most of a CPU step): 2,500 iterations (docs/qwen3_5.md)."""
    config = with_fields(
        demo_qwen3(), "model", num_layers=4, kv_channels=32, mrope_section=[2, 1, 1],
        rotary_percent=0.25, attention_output_gate=True, apply_layernorm_1p=True,
        experimental_attention_variant="gated_delta_net", linear_attention_freq=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=4,
        linear_num_value_heads=8)
    config = with_family(config, "qwen3_vl", vision_deepstack_visual_indexes=[])
    config = with_fields(config, "data", tokenizer_type="SentencePiece",
                         tokenizer_model=str(DIGITS_TOKENIZER))
    return demo_schedule(config, 2500, 500, "runs/demo-qwen35/checkpoints")

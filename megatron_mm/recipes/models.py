"""Starting points for what people train, at the published models' shapes (their Hugging
Face configs: the families' ``hf.py`` read the same fields), sized for 8 or 16 H100-class
GPUs. The data, tokenizer and checkpoint paths are placeholders (``DATA``, ``HF_DIR``,
``CKPT``) the user must set (``--data-path``, ``--tokenizer-model``, ``--load``): the
weights come from a converted Hugging Face checkpoint (``tools/convert_hf.py import``),
whose architecture flags take precedence over a recipe's (they are defaults, not flags
given)."""

from __future__ import annotations

from ..training.config.run_config import RunConfig
from .registry import defaults, recipe, with_family, with_fields

# Placeholders: the user's data (a folder of train / valid jsonl, docs/data.md), the
# converted checkpoint, the Hugging Face folder holding the tokenizer.
DATA = "DATA"
CKPT = "CKPT"
HF_DIR = "HF_DIR"


def finetune(config: RunConfig, *, tp: int, pp: int = 1, micro: int, global_batch: int,
             seq_length: int, lr: float, min_lr: float, iters: int, warmup: int,
             weight_decay: float = 0.0, ep: int = 1,
             sequence_parallel: bool = False) -> RunConfig:
    """A fine-tuning run from a converted checkpoint: bf16, the distributed optimizer,
    cosine decay after linear warm-up, gradient clipping at 1. Sequence parallelism only
    where the encoder takes it (the packed Qwen towers need the local attention for it)."""
    config = with_fields(config, "model", seq_length=seq_length)
    config = with_fields(config, "parallel", tensor_model_parallel_size=tp,
                         pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
                         sequence_parallel=sequence_parallel,
                         use_distributed_optimizer=True)
    config = with_fields(config, "training", micro_batch_size=micro,
                         global_batch_size=global_batch, train_iters=iters, lr=lr,
                         min_lr=min_lr, lr_decay_style="cosine", lr_warmup_iters=warmup,
                         weight_decay=weight_decay, clip_grad=1.0, adam_beta1=0.9,
                         adam_beta2=0.95, bf16=True)
    config = with_fields(config, "data", data_path=[DATA])
    config = with_fields(config, "checkpoint", load=CKPT, finetune=True, save="runs/ckpt",
                         save_interval=500)
    config = with_fields(config, "validation", eval_interval=500, eval_iters=10)
    return with_fields(config, "logging", log_interval=10)


def hf_tokenizer(config: RunConfig) -> RunConfig:
    """The Hugging Face tokenizer of the model's folder (placeholder ``HF_DIR``)."""
    return with_fields(config, "data", tokenizer_type="HuggingFaceTokenizer",
                       tokenizer_model=HF_DIR)


def qwen2_5_7b(config: RunConfig) -> RunConfig:
    """Qwen2.5-7B's LLM (Qwen/Qwen2.5-7B-Instruct config.json): 28 layers of 3584, 28 heads
    in 4 groups of 128, MLP 18944, q / k / v biases, RoPE base 1e6, untied output."""
    config = with_fields(
        config, "model", num_layers=28, hidden_size=3584, ffn_hidden_size=18944,
        num_attention_heads=28, group_query_attention=True, num_query_groups=4,
        kv_channels=128, add_qkv_bias=True, rotary_base=1e6, norm_epsilon=1e-6,
        max_position_embeddings=32768, untie_embeddings_and_output_weights=True)
    return hf_tokenizer(config)


def qwen3_vl_vision(config: RunConfig, deepstack) -> RunConfig:
    """Qwen3-VL's ViT (Qwen/Qwen3-VL-8B-Instruct vision_config): 27 layers of 1152, 16
    heads, MLP 4304, 16 px patches over 2 frames, 2 x 2 merged, a 48 x 48 position table."""
    config = with_fields(config, "model", vision_model_type="qwen3_vl",
                         vision_hidden_size=1152, vision_num_layers=27,
                         vision_num_attention_heads=16, vision_ffn_hidden_size=4304,
                         patch_dim=16, vision_norm_epsilon=1e-6, image_token_id=151655,
                         video_token_id=151656)
    config = with_family(config, "qwen2_5_vl", min_pixels=65536, max_pixels=16777216,
                         video_min_pixels=128 * 32 * 32, video_max_pixels=768 * 32 * 32)
    return with_family(config, "qwen3_vl", vision_deepstack_visual_indexes=deepstack,
                       vision_num_position_embeddings=2304)


def qwen3_llm(config: RunConfig, layers: int, hidden: int, heads: int, groups: int,
              ffn: int) -> RunConfig:
    """Qwen3-VL's LLM: q / k norms, 128-channel heads, interleaved M-RoPE [24, 20, 20]
    at base 5e6, untied output."""
    config = with_fields(
        config, "model", num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
        num_attention_heads=heads, group_query_attention=True, num_query_groups=groups,
        kv_channels=128, qk_layernorm=True, rotary_base=5e6, norm_epsilon=1e-6,
        position_embedding_type="mrope", mrope_section=[24, 20, 20], mrope_interleaved=True,
        max_position_embeddings=262144, untie_embeddings_and_output_weights=True)
    return hf_tokenizer(config)


@recipe("llava_7b_stage2", world_size=8, vocab_size=32000)
def llava_7b_stage2() -> RunConfig:
    """LLaVA-1.5's stage 2 (visual instruction tuning, 665K samples: one epoch at global
    batch 128): CLIP ViT-L/14-336 (frozen, features of its second-to-last layer) + an MLP
    projector + a Vicuna-7B-shaped LLM (Llama-2-7B: 32 layers of 4096, 32 heads, MLP
    11008), projector and LLM trained at lr 2e-5, 3 % warm-up, sequence 2048."""
    config = with_fields(
        defaults(), "model", num_layers=32, hidden_size=4096, ffn_hidden_size=11008,
        num_attention_heads=32, group_query_attention=False, rotary_base=10000.0,
        norm_epsilon=1e-5, max_position_embeddings=4096,
        untie_embeddings_and_output_weights=True, vision_model_type="clip",
        vision_hidden_size=1024, vision_num_layers=24, vision_num_attention_heads=16,
        vision_ffn_hidden_size=4096, img_h=336, img_w=336, patch_dim=14,
        vision_feature_layer=-2, projector_type="mlp", freeze_ViT=True)
    config = with_fields(config, "data", tokenizer_type="SentencePiece",
                         tokenizer_model=HF_DIR + "/tokenizer.model")
    return finetune(config, tp=2, micro=4, global_batch=128, seq_length=2048, lr=2e-5,
                    min_lr=0.0, iters=5198, warmup=156, sequence_parallel=True)


@recipe("qwen2_5_vl_7b_sft", world_size=8, vocab_size=152064)
def qwen2_5_vl_7b_sft() -> RunConfig:
    """Qwen2.5-VL-7B-Instruct SFT: its ViT (32 layers of 1280, window attention but in
    layers 7, 15, 23, 31) frozen, merger and LLM trained (M-RoPE [16, 24, 24])."""
    config = with_fields(
        qwen2_5_7b(defaults()), "model", position_embedding_type="mrope",
        mrope_section=[16, 24, 24], max_position_embeddings=128000,
        vision_model_type="qwen2_5_vl", vision_hidden_size=1280, vision_num_layers=32,
        vision_num_attention_heads=16, vision_ffn_hidden_size=3420, patch_dim=14,
        vision_norm_epsilon=1e-6, image_token_id=151655, video_token_id=151656,
        freeze_ViT=True)
    config = with_family(config, "qwen2_5_vl", vision_window_size=112,
                         vision_fullatt_block_indexes=[7, 15, 23, 31],
                         vision_tokens_per_second=2.0, min_pixels=3136,
                         max_pixels=12845056)
    return finetune(config, tp=2, micro=1, global_batch=32, seq_length=4096, lr=1e-5,
                    min_lr=1e-6, iters=2000, warmup=50)


@recipe("qwen3_vl_8b_sft", world_size=8, vocab_size=151936)
def qwen3_vl_8b_sft() -> RunConfig:
    """Qwen3-VL-8B-Instruct SFT: its ViT (DeepStack from layers 8, 16, 24) frozen, mergers
    and LLM (36 layers of 4096, 32 heads in 8 groups, MLP 12288) trained."""
    config = qwen3_vl_vision(qwen3_llm(defaults(), 36, 4096, 32, 8, 12288), [8, 16, 24])
    config = with_fields(config, "model", freeze_ViT=True)
    return finetune(config, tp=2, micro=1, global_batch=32, seq_length=4096, lr=1e-5,
                    min_lr=1e-6, iters=2000, warmup=50)


@recipe("qwen3_5_9b_lora", world_size=8, vocab_size=248320)
def qwen3_5_9b_lora() -> RunConfig:
    """Qwen3.5-9B with LoRA adapters (rank 32, alpha 64, every linear of the LLM), tower
    frozen: 32 layers of 4096, three Gated DeltaNet layers (16 key / 32 value heads of 128)
    then one gated full attention (16 heads in 4 groups of 256, a quarter rotated), MLP
    12288. Data parallel only: the frozen base fits one GPU."""
    config = qwen3_vl_vision(qwen3_llm(defaults(), 32, 4096, 16, 4, 12288), [])
    config = with_fields(
        config, "model", kv_channels=256, rotary_base=1e7, mrope_section=[11, 11, 10],
        rotary_percent=0.25, attention_output_gate=True, apply_layernorm_1p=True,
        experimental_attention_variant="gated_delta_net", linear_attention_freq=4,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_conv_kernel_dim=4, image_token_id=248056,
        video_token_id=248057, lora_rank=32, lora_alpha=64.0, freeze_ViT=True)
    return finetune(config, tp=1, micro=1, global_batch=64, seq_length=4096, lr=1e-4,
                    min_lr=1e-5, iters=1000, warmup=30)


@recipe("internvl3_8b", world_size=8, vocab_size=151674)
def internvl3_8b() -> RunConfig:
    """InternVL3-8B SFT: InternViT-300M-448px-V2.5 (24 layers of 1024, layer scale,
    dynamic 448 px tiles up to 12 plus a thumbnail, pixel shuffle 0.5) frozen, MLP
    projector and a Qwen2.5-7B-shaped LLM trained."""
    config = with_fields(
        qwen2_5_7b(defaults()), "model", vision_model_type="internvit",
        vision_hidden_size=1024, vision_num_layers=24, vision_num_attention_heads=16,
        vision_ffn_hidden_size=4096, img_h=448, img_w=448, patch_dim=14,
        vision_norm_epsilon=1e-6, image_token_id=151667, freeze_ViT=True)
    config = with_family(config, "internvit", vision_norm_type="layer_norm",
                         vision_add_qkv_bias=True, vision_layerscale_init=0.1,
                         downsample_ratio=0.5, max_num_tiles=12, use_thumbnail=True)
    return finetune(config, tp=2, micro=1, global_batch=64, seq_length=8192, lr=2e-5,
                    min_lr=0.0, iters=2000, warmup=60, weight_decay=0.05)


@recipe("qwen3_vl_30b_a3b_ep", world_size=16, vocab_size=151936)
def qwen3_vl_30b_a3b_ep() -> RunConfig:
    """Qwen3-VL-30B-A3B-Instruct SFT with expert parallelism: 48 MoE layers of 2048 (128
    experts of 768, top 8, 32 heads in 4 groups) on two 8-GPU nodes: the planner's layout
    of docs/moe.md (TP 1, EP 8 within a node, DP 16; it beat Megatron-Bridge's TP 4, PP 2,
    EP 4 there), all-to-all dispatch. On GPUs with Transformer Engine add
    ``--transformer-impl transformer_engine --moe-grouped-gemm``."""
    config = qwen3_vl_vision(qwen3_llm(defaults(), 48, 2048, 32, 4, 6144), [8, 16, 24])
    config = with_fields(config, "model", freeze_ViT=True)
    config = with_fields(config, "moe", num_experts=128, moe_ffn_hidden_size=768,
                         moe_router_topk=8,
                         moe_token_dispatcher_type="alltoall",
                         moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3)
    return finetune(config, tp=1, ep=8, micro=1, global_batch=64, seq_length=4096,
                    lr=1e-5, min_lr=1e-6, iters=2000, warmup=50)

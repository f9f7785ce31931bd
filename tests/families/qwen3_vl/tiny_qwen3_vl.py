"""Tiny random Qwen3-VL-shaped Hugging Face models and the batch their conversion tests
run (two images of different sizes, a two-frame video), for Qwen3-VL and Qwen3-VL-MoE."""

import torch

VOCAB, IMAGE, VIDEO, START, END = 250, 247, 248, 245, 246
SEQ = 56
PATCH = 16
GRIDS = {"image": [(1, 8, 12), (1, 4, 4)], "video": [(2, 4, 8)]}  # 24, 4 and 2 x 8 tokens


def config(kind: str, text=None, text_base=None, **vision):
    """``transformers.<kind>Config`` (``Qwen3VL`` or ``Qwen3VLMoe``): a 4-layer tower feeding
    DeepStack from layers 0-2, a 4-layer LLM with interleaved M-RoPE; ``text_base`` adds to
    the text config (the experts), ``text`` / ``vision`` override fields."""
    import transformers

    cfg = getattr(transformers, f"{kind}Config")(
        text_config={**dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                             "mrope_section": [2, 3, 3],
                                             "mrope_interleaved": True}, **(text_base or {})),
                     **(text or {})},
        vision_config={**dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                              out_hidden_size=64, patch_size=PATCH, num_position_embeddings=16,
                              deepstack_visual_indexes=[0, 1, 2]), **vision},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=False)
    cfg.architectures = [f"{kind}ForConditionalGeneration"]
    return cfg


def tiny(cfg):
    """The model of ``cfg``, seeded, with weights that let no mapping mix-up hide."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cfg.architectures[0])(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):  # random norms and biases
                p.add_(torch.randn_like(p) * 0.1)
            if "language_model" in n and ("q_proj" in n or "k_proj" in n):
                p.mul_(4.0)  # sharp attention: the 3-D positions show in the logits
            if "deepstack_merger_list" in n and "linear_fc2" in n:
                p.mul_(4.0)  # DeepStack features large enough to show
            if n.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)  # distinct routes (transformers initialises it to 0)
    return model


def inputs():
    """Row 0: image 0, then the video's two frames, each after its timestamp text and
    between vision tags; row 1: image 1 (every row unpadded, length SEQ)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 240, (2, SEQ), generator=gen)
    ids[0, 2], ids[0, 3:27], ids[0, 27] = START, IMAGE, END
    ids[0, 30], ids[0, 31:39], ids[0, 39] = START, VIDEO, END
    ids[0, 42], ids[0, 43:51], ids[0, 51] = START, VIDEO, END
    ids[1, 5], ids[1, 6:10], ids[1, 10] = START, IMAGE, END
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for kind, rows, grid in (("image", "pixel_values", "image_grid_thw"),
                             ("video", "pixel_values_videos", "video_grid_thw")):
        patches = sum(t * h * w for t, h, w in GRIDS[kind])
        batch[rows] = torch.randn(patches, 3 * 2 * PATCH * PATCH, generator=gen)
        batch[grid] = torch.tensor(GRIDS[kind])
    return batch

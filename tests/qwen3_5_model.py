"""A tiny Qwen3.5-shaped model's flags (the training, bad-input and demo tests): Qwen3-VL's
tower without DeepStack (2 layers), a 4-layer hybrid LLM (Gated DeltaNet at 0 and 2, gated
full attention at 1 and 3, a quarter of each 32-wide head rotated by interleaved M-RoPE,
zero-centred norms; GDN with 2 key and 4 value heads of 16)."""

QWEN3_5_MODEL = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--kv-channels", "32", "--qk-layernorm", "--untie-embeddings-and-output-weights",
    "--seq-length", "96", "--vision-model-type", "qwen3_vl", "--vision-hidden-size", "32",
    "--vision-num-layers", "2", "--vision-num-attention-heads", "2",
    "--vision-ffn-hidden-size", "64", "--patch-dim", "16", "--vision-deepstack-visual-indexes",
    "--vision-num-position-embeddings", "16",
    "--min-pixels", "1024", "--max-pixels", "9216", "--video-min-pixels", "1024",
    "--video-max-pixels", "4096", "--position-embedding-type", "mrope",
    "--mrope-section", "2", "1", "1", "--mrope-interleaved", "--rotary-percent", "0.25",
    "--attention-output-gate", "--apply-layernorm-1p",
    "--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2",
    "--linear-key-head-dim", "16", "--linear-value-head-dim", "16",
    "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
    "--lr", "1e-3", "--lr-decay-style", "constant", "--weight-decay", "0.0",
    "--log-interval", "1", "--eval-iters", "1", "--skip-final-eval",
]

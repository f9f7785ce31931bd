"""Qwen2-Audio (Whisper encoder + Linear + Qwen2) -> megatron_mm: logits equal
transformers' at TP=1, and export gives back the same state dict."""

import pytest
import torch

VOCAB, AUDIO_TOKEN = 250, 249
MAX_POS, MELS = 20, 16  # 40 mel frames -> 20 encoder frames -> 10 tokens after pooling
TOLERANCE = 1e-4


def _tiny_qwen2_audio():
    import transformers
    from transformers import AutoConfig

    text = AutoConfig.for_model(
        "qwen2", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False)
    audio = AutoConfig.for_model(
        "qwen2_audio_encoder", d_model=32, encoder_layers=2, encoder_attention_heads=2,
        encoder_ffn_dim=64, num_mel_bins=MELS, max_source_positions=MAX_POS)
    config = AutoConfig.for_model("qwen2_audio", text_config=text.to_dict(),
                                  audio_config=audio.to_dict(), audio_token_id=AUDIO_TOKEN)
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    torch.manual_seed(0)
    model = transformers.Qwen2AudioForConditionalGeneration(config).eval()
    with torch.no_grad():  # random norms and biases: a mapping mix-up cannot hide
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen2_audio")
    model = _tiny_qwen2_audio()
    model.save_pretrained(str(root / "hf"))
    with single_rank_world():
        import_hf(str(root / "hf"), str(root / "ckpt"), tensor_model_parallel_size=2)
    return model, str(root / "ckpt")


def _load(ckpt):
    from megatron_mm.models import build_model
    from megatron_mm.training.checkpoint.checkpointing import load_checkpoint, saved_args
    from megatron_mm.training.assembly.build_settings import build_settings
    from megatron_mm.training.cli.arguments import parse_run_config

    config = parse_run_config(["--load", ckpt], world_size=1)
    lm = config.model_config.language
    lm.padded_vocab_size = lm.vocab_size = saved_args(config.checkpoint)["padded_vocab_size"]
    model = build_model(config.model_config, build_settings(config),
                        {"audio": config.model.audio_token_id})
    load_checkpoint(config, [model], None, None)
    return model.eval()


def _inputs():
    n_tokens = MAX_POS // 2
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, AUDIO_TOKEN, (2, 16), generator=g)
    tokens[:, 2:2 + n_tokens] = AUDIO_TOKEN
    mels = torch.randn(2, MELS, 2 * MAX_POS, generator=g)
    return tokens, mels


def _expected(hf_model, tokens, mels):
    with torch.no_grad():
        return hf_model(input_ids=tokens, input_features=mels,
                        feature_attention_mask=torch.ones(2, 2 * MAX_POS, dtype=torch.long)
                        ).logits


def test_qwen2_audio_logits_equal_hugging_face(converted, gloo_world):
    hf_model, ckpt = converted
    tokens, mels = _inputs()
    expected = _expected(hf_model, tokens, mels)
    with torch.no_grad():
        model = _load(ckpt)
        media = {"audio": mels, "audio_frames": torch.full((2,), 2 * MAX_POS)}
        got = model(tokens, torch.arange(16).expand(2, -1), media)
    diff = (got[..., :VOCAB] - expected).abs().max().item()
    print(f"qwen2-audio: max abs logit difference {diff:.3g}")
    assert diff <= TOLERANCE


@pytest.mark.processes
def test_qwen2_audio_at_tp2(converted):
    """The affine projector at TP=2 (Megatron-Core's adds a bias shard to the gathered
    output; models/affine_projector.py), run by the processes compare starts."""
    from megatron_mm.hf.compare import megatron_logits

    hf_model, ckpt = converted
    tokens, mels = _inputs()
    media = {"audio": mels, "audio_frames": torch.full((2,), 2 * MAX_POS)}
    got = megatron_logits(ckpt, tokens, media, tp=2)
    diff = (got[..., :VOCAB] - _expected(hf_model, tokens, mels)).abs().max().item()
    print(f"qwen2-audio TP=2: max abs logit difference {diff:.3g}")
    assert diff <= TOLERANCE


def test_qwen2_audio_round_trip(converted, gloo_world, tmp_path):
    from megatron_mm.hf.convert import export_hf

    original, ckpt = converted
    out = export_hf(ckpt, str(tmp_path / "exported"))
    reloaded, info = type(original).from_pretrained(out, output_loading_info=True,
                                                    dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    want, got = original.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key

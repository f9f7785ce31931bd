"""The Whisper audio encoder (Qwen2-Audio's, pooled by 2): log-mel clips padded to the
encoder's length, each handing the LLM the features its audio reaches."""

from __future__ import annotations

from ...config import ConfigError
from ...plan.model import EncoderSpec, whisper_stem_flops
from ..encoder import BuiltinData, EncoderFamily, encoder_transformer
from .config import AudioEncoderConfig


def from_model_args(model) -> AudioEncoderConfig:
    return AudioEncoderConfig(
        model_type=model.audio_model_type,
        hidden_size=model.audio_hidden_size,
        num_layers=model.audio_num_layers,
        num_attention_heads=model.audio_num_attention_heads,
        ffn_hidden_size=model.audio_ffn_hidden_size,
        num_mel_bins=model.audio_num_mel_bins,
        max_source_positions=model.audio_max_source_positions,
        pool_stride=model.audio_pool_stride,
        layernorm_epsilon=model.audio_norm_epsilon,
    )


def planner_spec(name: str, enc: AudioEncoderConfig, items_per_sample: int,
                 common: dict) -> EncoderSpec:
    """Costs of full-length clips (every clip is padded to the encoder's length)."""
    h = enc.hidden_size
    return EncoderSpec(
        name=name, modality="audio",
        transformer=encoder_transformer(enc),
        tokens_per_item=enc.seq_length, llm_tokens_per_item=enc.num_output_tokens,
        items_per_sample=items_per_sample,
        embed_flops_per_token=whisper_stem_flops(enc.num_mel_bins, h),
        embed_params=3 * enc.num_mel_bins * h + 3 * h * h + 2 * h,
        **common)


def feature_tokens(enc: AudioEncoderConfig, media: dict):
    """Each clip's features: the first ``output_tokens(frames)`` of its padded rows."""
    from ...models.batch_layout import MediaMismatchError  # torch: only with a batch

    mels = media.get("audio")
    n = 0 if mels is None else mels.shape[0]
    if n == 0:
        return 0, None
    frames = media.get("audio_frames")
    if frames is None or frames.shape[0] != n:
        raise MediaMismatchError(f"batch has {n} audio items but "
                                 f"{'no' if frames is None else frames.shape[0]} "
                                 "lengths in media['audio_frames']")
    return n, [enc.output_tokens(int(f)) for f in frames.detach().cpu().tolist()]


def fp8_token_counts(name: str, enc: AudioEncoderConfig) -> dict:
    return {name: (enc.seq_length, "--audio-max-source-positions"),
            f"{name}-projector": (enc.num_output_tokens,
                                  "--audio-max-source-positions / --audio-pool-stride")}


def check_sequence_parallel(name: str, enc: AudioEncoderConfig, tp: int, impl: str) -> None:
    """Frames split over the TP ranks, each rank's shard a whole number of pooling
    windows."""
    t = enc.seq_length
    if t % tp:
        raise ConfigError(
            f"--sequence-parallel splits the {name} encoder's {t} frames "
            f"(--audio-max-source-positions) over --tensor-model-parallel-size {tp} ranks: "
            f"it must be a multiple of {tp}")
    stride = enc.pool_stride
    if (t // tp) % stride:
        raise ConfigError(
            f"--sequence-parallel: each TP rank's {t // tp} frames of the {name} encoder "
            f"must be whole windows of --audio-pool-stride {stride}")


WHISPER = EncoderFamily(
    model_type="whisper", slot="audio", modality="audio", config_class=AudioEncoderConfig,
    from_model_args=from_model_args, planner_spec=planner_spec,
    build="megatron_mm.families.whisper.model:build_audio_encoder",
    media="megatron_mm.families.whisper.media:audio_processor",
    feature_tokens=feature_tokens, padded_features=True, fp8_token_counts=fp8_token_counts,
    check_sequence_parallel=check_sequence_parallel,
    # handwritten + spoken digits: a vision + audio model, or audio alone, trains on them
    builtin_data=BuiltinData("spoken_digits",
                             "megatron_mm.data.spoken_digits:prepare_spoken_digits",
                             ("image", "audio")))

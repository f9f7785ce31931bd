"""The planner's model of a training configuration (megatron_mm.config): families.model_spec."""

from megatron_mm.config import FreezeConfig, LanguageModelConfig, MultimodalModelConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.families.model_spec import model_spec
from megatron_mm.plan import Workload, build_chain


def test_model_spec():
    config = MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(hidden_size=64, num_layers=4, feature_layer=-2,
                                                img_h=28, img_w=28, patch_dim=7,
                                                drop_class_token=True)},
        language=LanguageModelConfig(vocab_size=1000, hidden_size=128, num_layers=3,
                                     num_attention_heads=4, num_query_groups=2),
        freeze=FreezeConfig(language_model=True, encoders={"vision"}))
    spec = model_spec(config, images_per_sample=2)
    enc = spec.encoders[0]
    assert enc.transformer.num_layers == 3  # feature layer -2: the last layer is not built
    assert (enc.tokens_per_item, enc.llm_tokens_per_item) == (17, 16)  # class token dropped
    assert spec.media_tokens_per_sample == 32
    assert spec.llm.vocab_size == 1024 and spec.llm.num_query_groups == 2  # padded to 128
    assert spec.llm.gated_linear_unit and spec.freeze_llm
    assert spec.frozen_encoders == ["vision"] and spec.frozen_projectors == []
    chain = build_chain(spec, Workload(seq_length=64))
    assert [l.kind for l in chain].count("vision_layer") == 3
    assert [l.total_flops / l.fwd_flops for l in chain if l.kind == "vision_layer"] == [1.0] * 3


def test_from_config_with_vision_and_audio():
    from megatron_mm.families.whisper.config import AudioEncoderConfig
    from megatron_mm.plan.pipeline.placement import chunk_placements
    from megatron_mm.plan.pipeline.partition import partition

    config = MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(hidden_size=64, num_layers=2, img_h=16,
                                                img_w=16, patch_dim=4),
                  "audio": AudioEncoderConfig(hidden_size=64, num_layers=3,
                                              max_source_positions=50, pool_stride=2)},
        language=LanguageModelConfig(vocab_size=1000, hidden_size=128, num_layers=2,
                                     num_attention_heads=4),
        freeze=FreezeConfig(encoders={"audio"}))
    spec = model_spec(config)
    audio = spec.encoders[1]
    assert (audio.name, audio.modality) == ("audio", "audio")
    assert (audio.tokens_per_item, audio.llm_tokens_per_item) == (50, 25)
    assert spec.media_tokens_per_sample == 17 + 25
    chain = build_chain(spec, Workload(seq_length=64))
    kinds = [l.kind for l in chain]
    assert kinds.count("audio_layer") == 3 and kinds.count("audio_embed") == 1
    # frozen audio: forward only (nothing trainable upstream in its own branch)
    assert all(l.bwd_flops == 0 for l in chain if l.branch == "audio" and l.kind != "projector")
    # both encoders are one stream of work for the partitioner: a cut may fall in either
    part = partition(chain, 2, 1, [8, len(chain) - 8])  # ... audio embed, audio 0-1 | ...
    first, second = chunk_placements(chain, part)
    assert first.sends_encoder == "audio" and second.receives_encoder == "audio"
    assert first.encoder("audio").layers == [0, 2] and second.encoder("audio").layers == [2, 3]


def test_tied_output_weight_counted_once_where_the_embedding_is():
    """Megatron keeps one tensor for a tied output layer at PP=1 and a copy on the last
    stage at PP>1; untied, the two are separate weights everywhere."""
    from megatron_mm.plan import MemoryModel, StagePartition
    from megatron_mm.plan.pipeline.recompute_budget import static_bytes

    def config(untie):
        return MultimodalModelConfig(
            encoders={"vision": VisionEncoderConfig(hidden_size=64, num_layers=2, img_h=16,
                                                    img_w=16, patch_dim=4)},
            language=LanguageModelConfig(vocab_size=1000, hidden_size=128, num_layers=2,
                                         num_attention_heads=4,
                                         untie_embeddings_and_output_weights=untie))
    tied = build_chain(model_spec(config(False)), Workload(seq_length=64))
    untied = build_chain(model_spec(config(True)), Workload(seq_length=64))
    embedding = 1024 * 128 * 16  # padded vocabulary x hidden x 16 bytes per trainable param
    assert tied[-1].tied_params * 16 == embedding and untied[-1].tied_params == 0
    whole = StagePartition(1, 1, [len(tied)]).chunk_bounds()
    (one,) = static_bytes(tied, whole, 1, MemoryModel())
    (two,) = static_bytes(untied, whole, 1, MemoryModel())
    assert two - one == embedding
    halves = StagePartition(2, 1, [5, len(tied) - 5]).chunk_bounds()
    assert static_bytes(tied, halves, 2, MemoryModel()) == static_bytes(untied, halves, 2,
                                                                       MemoryModel())


def test_hybrid_llm_reads_linear_attention():
    """Qwen3.5's LLM: the Gated DeltaNet sizes and Megatron-LM's layer pattern reach the
    planner by their names, with the gate and the head dimension of the attention layers."""
    from megatron_mm.config import LinearAttentionConfig
    from megatron_mm.plan.costs import flops

    la = LinearAttentionConfig(linear_attention_freq=2, linear_key_head_dim=16,
                               linear_value_head_dim=8, linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_conv_kernel_dim=3,
                               chunk_size=32)
    config = MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(hidden_size=64, num_layers=1, img_h=16,
                                                img_w=16, patch_dim=4)},
        language=LanguageModelConfig(vocab_size=1000, hidden_size=128, num_layers=4,
                                     num_attention_heads=4, kv_channels=64,
                                     attention_output_gate=True, linear_attention=la))
    llm = model_spec(config).llm
    assert llm.linear_attention_freq == [1, 0, 1, 0] and llm.kv_channels == 64
    assert llm.attention_output_gate and llm.linear_attention.linear_conv_kernel_dim == 3
    assert (llm.linear_attention.chunk_size, llm.linear_attention.v_dim) == (32, 32)
    chain = build_chain(model_spec(config), Workload(seq_length=64))
    layers = [l for l in chain if l.kind == "llm_layer"]
    assert [l.fwd_flops for l in layers] == [flops.llm_layer(llm, i, 1, 64).fwd
                                             for i in range(4)]
    assert layers[0].fwd_flops == layers[2].fwd_flops != layers[1].fwd_flops

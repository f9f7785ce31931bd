"""set_is_first_microbatch reaches every FP8 module through Megatron-Core's wrappers, as
Megatron-Core's forward_step calls it (on the outermost one)."""

import pytest
import torch


@pytest.mark.parametrize("bf16", [False, True])
def test_first_microbatch_reaches_an_fp8_projector_under_a_bf16_llm(gloo_world, bf16):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.utils import get_attr_wrapped_model

    from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig, VisionEncoderConfig
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.models.wrappers import DistributedDataParallel, Float16Module
    from megatron_mm.plan.fp8 import Fp8Settings

    torch.manual_seed(0)
    cfg = MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(hidden_size=32, num_layers=1,
                                                num_attention_heads=2, img_h=16, img_w=16,
                                                patch_dim=4, drop_class_token=True)},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_layers=1,
                                     num_attention_heads=4, num_query_groups=2))
    fp8 = Fp8Settings("hybrid", modules=("vision-projector",), emulation=True)
    model = build_model(cfg, BuildSettings(fp8=fp8, bf16=bf16), {"image": 250})
    assert model.config.fp8 is None  # the LLM's config: Megatron-Core's check looks there
    inner = Float16Module(model.config, model) if bf16 else model
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), inner)
    fc1 = model.vision_projection.encoder.linear_fc1
    for call in (ddp.set_is_first_microbatch,  # Megatron-Core's forward_step
                 get_attr_wrapped_model(ddp, "set_is_first_microbatch")):  # our executor
        fc1.is_first_microbatch = False
        call()
        assert fc1.is_first_microbatch is True

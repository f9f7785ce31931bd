"""set_is_first_microbatch reaches every FP8 module through Megatron-Core's wrappers, as
Megatron-Core's forward_step calls it (on the outermost one)."""

import pytest
from tiny_multimodal import tiny_model


@pytest.mark.parametrize("bf16", [False, True])
def test_first_microbatch_reaches_an_fp8_projector_under_a_bf16_llm(gloo_world, bf16):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.utils import get_attr_wrapped_model

    from megatron_mm.models.wrappers import DistributedDataParallel, Float16Module
    from megatron_mm.plan.fp8 import Fp8Settings

    fp8 = Fp8Settings("hybrid", modules=("vision-projector",), emulation=True)
    model = tiny_model(fp8, bf16=bf16, vit_layers=1, llm_layers=1)
    assert model.config.fp8 is None  # the LLM's config: Megatron-Core's check looks there
    inner = Float16Module(model.config, model) if bf16 else model
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), inner)
    fc1 = model.vision_projection.encoder.linear_fc1
    for call in (ddp.set_is_first_microbatch,  # Megatron-Core's forward_step
                 get_attr_wrapped_model(ddp, "set_is_first_microbatch")):  # our executor
        fc1.is_first_microbatch = False
        call()
        assert fc1.is_first_microbatch is True

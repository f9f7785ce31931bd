"""Layer profiles time each layer in the FP8 context training runs it in: a layer run alone
bypasses its TransformerBlock's FP8 autocast, and would otherwise be timed in BF16."""

import pytest
import torch
from tiny_multimodal import tiny_config, tiny_model


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_layers_profiled_under_the_runs_fp8(gloo_world, recipe):
    from megatron_mm.models import model_chain
    from megatron_mm.models.fp8_emulation import emulated_linears
    from megatron_mm.plan.fp8 import Fp8Settings
    from megatron_mm.training.loop.layer_profile import profile_layers

    fp8 = Fp8Settings("hybrid", recipe=recipe, modules=("llm", "vision", "vision-projector"),
                      emulation=True)
    # SigLIP: 16 patch rows per image, no class token (CLIP's 17 rows per image fail TE's
    # FP8 dims check at this micro-batch, as the emulation now reproduces)
    model = tiny_model(fp8, seq_length=32, vit_type="siglip")
    cfg = tiny_config(seq_length=32, vit_type="siglip")
    tokens = torch.randint(0, 200, (2, 32))
    tokens[:, 2:18] = 250
    batch = dict(tokens=tokens, position_ids=torch.arange(32).expand(2, -1), labels=tokens,
                 loss_mask=torch.ones(2, 32), media={"image": torch.randn(2, 3, 16, 16)})
    chain = model_chain(cfg, seq_length=32, micro_batch_size=2)
    profile_layers(model, chain, [batch], warmup=0)
    linears = {n: m for n, m in model.named_modules() if m in emulated_linears(model)}
    assert any(n.startswith("language_model.decoder") for n in linears)
    assert any(n.startswith("vision_model.decoder") for n in linears)
    assert {n: m.fp8_emulation.weight_casts for n, m in linears.items()
            if m.fp8_emulation.weight_casts == 0} == {}

"""LoRA fine-tuning attends with FlexAttention on a GPU (``make gpu-check``'s
``flex-attention``): LoRA needs Megatron-Core's local layers, whose own attention
materialises the [B, heads, S, S] scores, so ``--attention-backend auto`` gives them
FlexAttention for the plain causal mask too (``models/attention_choice.py``). A tiny model
with adapters on every LLM linear takes a few SGD steps (adapters and projector trained,
bases frozen) on FlexAttention and on the local path from the same weights: the same
losses and adapter gradients, fp32. Without CUDA only the choice and the two models are
checked (FlexAttention's CPU forward compiles for most of a minute; the set-up of the
comparison is test_flex_training.py's)."""

import pytest
import torch

from flex_models import flex_test_config
from megatron_mm.config import LoraConfig

pytestmark = pytest.mark.slow  # compiles flex_attention

MEDIA_ID, ITEM, S, STEPS = 250, 16, 320, 3
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _build(flex: bool, device):
    from megatron_mm.models import BuildSettings, build_model

    cfg = flex_test_config(S, LoraConfig(targets=(("language_model", TARGETS),), rank=4,
                                          alpha=8.0))
    torch.manual_seed(0)
    return build_model(cfg, BuildSettings(cp_attention="flex" if flex else "none"),
                       {"image": MEDIA_ID}).to(device)


def test_lora_choice_and_training_on_flex(world, fp32_matmuls):
    from megatron_mm.models.attention_choice import choose_attention
    from megatron_mm.models.flex_attention import FlexAttention

    cuda = torch.cuda.is_available()
    assert choose_attention("auto", 1, "local", False, True, lora=True).kind == "flex"
    device = torch.device("cuda" if cuda else "cpu")
    local, flex = _build(False, device), _build(True, device)
    flex.load_state_dict(local.state_dict())
    assert any(isinstance(m, FlexAttention) for m in flex.modules())
    assert not any(isinstance(m, FlexAttention) for m in local.modules())
    if not cuda:
        return
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 200, (2, S), generator=g)
    tokens[:, 4:4 + ITEM] = MEDIA_ID
    batch = dict(tokens=tokens.to(device), position_ids=torch.arange(S).expand(2, -1).to(device),
                 media={"image": torch.randn(2, 3, 32, 32, generator=g).to(device)},
                 labels=torch.randint(0, 200, (2, S), generator=g).to(device))
    models = {"local": local, "flex": flex}
    optimizers = {k: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
                  for k, m in models.items()}
    for step in range(STEPS):
        losses, grads = {}, {}
        for name, model in models.items():
            per_token = model(**batch).float()  # causal mask: attention_mask None
            losses[name] = per_token.detach()
            optimizers[name].zero_grad()
            per_token.mean().backward()
            grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}
            optimizers[name].step()
        torch.testing.assert_close(losses["flex"], losses["local"], rtol=0, atol=2e-5,
                                   msg=lambda m: f"step {step}: {m}")
        assert any(".lora_A" in n for n in grads["local"])
        for n, ref in grads["local"].items():
            err, scale = (grads["flex"][n] - ref).norm(), ref.norm()
            assert err <= 1e-3 * scale + 1e-6, f"step {step} {n}: {err:.3g} vs {scale:.3g}"

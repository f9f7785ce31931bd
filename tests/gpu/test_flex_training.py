"""FlexAttention trains like the local path (``make gpu-check``'s ``flex-attention``): a tiny
model takes a few SGD steps with bidirectional media items, and with packed samples (per
sample blocks, media bidirectional inside), on FlexAttention (one GPU, CP=1, its block
mask from the codes) and on the local path (Megatron-Core's ``DotProductAttention`` with
the dense mask) from the same weights: the same losses and gradients at every step, fp32.
Without CUDA the same comparison runs forward only (torch runs no FlexAttention backward
on CPU), which checks this test's own set-up. Both count the kernels compiled for
flex_attention against Dynamo's recompile limit."""

import numpy as np
import pytest
import torch

from flex_models import flex_test_config

pytestmark = pytest.mark.slow  # compiles flex_attention

MEDIA_ID, ITEM, S, STEPS = 250, 16, 320, 3
IMAGES = ((4, 150), (30, 230))  # each row's images: first placeholder positions
DOCS = (0, 100, 200)  # packed: sample starts in every row


def _build(flex: bool, device):
    from megatron_mm.models import BuildSettings, build_model

    cfg = flex_test_config(S)
    torch.manual_seed(0)
    settings = BuildSettings(media_attention="bidirectional",
                             cp_attention="flex" if flex else "ours")
    return build_model(cfg, settings, {"image": MEDIA_ID}).to(device)


def _batch(packed: bool, device):
    from megatron_mm.models.context_parallel import batch_codes

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 200, (2, S), generator=g)
    for row, starts in enumerate(IMAGES):
        for start in starts:
            tokens[row, start:start + ITEM] = MEDIA_ID
    docs = None
    if packed:
        docs = torch.from_numpy(np.searchsorted(DOCS, np.arange(S), side="right") - 1)
        docs = docs.expand(2, -1)
    codes = batch_codes(tokens, {MEDIA_ID: ITEM}, docs, "bidirectional")
    return dict(tokens=tokens.to(device), codes=codes,
                labels=torch.randint(0, 200, (2, S), generator=g).to(device),
                images=torch.randn(4, 3, 32, 32, generator=g).to(device),
                position_ids=torch.arange(S).expand(2, -1).to(device))


@pytest.mark.parametrize("packed", [False, True], ids=["bidirectional", "packed"])
def test_flex_trains_like_the_local_path(world, fp32_matmuls, packed):
    from megatron_mm.models.context_parallel import dense_mask
    from megatron_mm.models.flex_attention import FlexAttention, MaskCodes, compile_count

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    b = _batch(packed, device)
    local, flex = _build(False, device), _build(True, device)
    flex.load_state_dict(local.state_dict())
    assert any(isinstance(m, FlexAttention) for m in flex.modules())
    masks = {"local": dense_mask(b["codes"], device),
             "flex": MaskCodes(torch.from_numpy(b["codes"]).to(device))}
    models = {"local": local, "flex": flex}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    for step in range(STEPS if cuda else 1):
        losses, grads = {}, {}
        for name, model in models.items():
            with torch.set_grad_enabled(cuda):
                per_token = model(b["tokens"], b["position_ids"], {"image": b["images"]},
                                  labels=b["labels"], attention_mask=masks[name]).float()
            losses[name], loss = per_token.detach(), per_token.mean()
            if cuda:
                optimizers[name].zero_grad()
                loss.backward()
                grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}
                optimizers[name].step()
        torch.testing.assert_close(losses["flex"], losses["local"], rtol=0, atol=2e-5,
                                   msg=lambda m: f"step {step}: {m}")
        for n, ref in grads.get("local", {}).items():
            err, scale = (grads["flex"][n] - ref).norm(), ref.norm()
            assert err <= 1e-3 * scale + 1e-6, f"step {step} {n}: {err:.3g} vs {scale:.3g}"
    # Kernels compiled for flex_attention in this process so far (both masks, forward and
    # backward, every step): past Dynamo's recompile limit flex would run eagerly (here a
    # FlexRecompileLimit error); gpu-check reports the count
    limit = torch._dynamo.config.recompile_limit
    held = compile_count()
    print(f"flex_attention kernels compiled: {held} (recompile limit {limit})")
    assert 1 <= held <= limit // 2, (held, limit)

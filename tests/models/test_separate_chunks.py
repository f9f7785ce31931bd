"""The separate placement's model chunks on one rank: an encoder rank's chunk (every
encoder whole, no LLM layer) and the LLM's chunk 0 (the projector merging the encoder
output it is handed) hold the colocated model's parameters under its names, and the two,
run one after the other with the encoder output passed between them as a leaf, give the
colocated model's loss and gradients."""

import pytest
import torch

from tiny_multimodal import MEDIA_ID, tiny_config


@pytest.mark.parametrize("frozen_vit", [False, True], ids=["trainable-vit", "frozen-vit"])
def test_encoder_chunk_and_llm_chunk_equal_the_colocated_model(gloo_world, frozen_vit):
    from megatron_mm.config import FreezeConfig
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.models.build import model_chain
    from megatron_mm.plan import StagePartition
    from megatron_mm.plan.schedules.encoder_pipeline import split_chain
    from megatron_mm.plan.schedules.separate_placements import separate_model_placements

    cfg = tiny_config()
    if frozen_vit:
        cfg.freeze = FreezeConfig(encoders=["vision"])
    torch.manual_seed(0)
    whole = build_model(cfg, BuildSettings(), {"image": MEDIA_ID})
    chain = model_chain(cfg)
    places = separate_model_placements(chain, StagePartition(
        1, 1, [len(split_chain(chain)[1])]))
    encoder, llm = (build_model(cfg, BuildSettings(placements=[p]), {"image": MEDIA_ID},
                                placement=p) for p in (places.encoder, places.llm[0]))
    state = whole.state_dict()
    names = [set(n for n, _ in m.named_parameters()) for m in (encoder, llm)]
    assert not names[0] & names[1]  # each parameter on one side, under its colocated name
    assert names[0] | names[1] == set(n for n, _ in whole.named_parameters())
    assert all(n.startswith("vision_model.") for n in names[0])
    for m in (encoder, llm):  # strict: the checkpoint keys are the colocated ones
        m.load_state_dict({k: v for k, v in state.items() if k in m.state_dict()})

    torch.manual_seed(1)
    tokens = torch.randint(0, 200, (2, 48))
    tokens[0, 3:19] = MEDIA_ID  # one 16-token image per sample
    tokens[1, 10:26] = MEDIA_ID
    pos = torch.arange(48).expand(2, -1)
    media = {"image": torch.randn(2, 3, 16, 16)}
    labels = torch.randint(0, 200, tokens.shape)
    ref = whole(tokens, pos, media, labels=labels).sum()
    ref.backward()

    layers = places.pieces[0].layers[0]
    out = encoder.run_encoder_piece("vision", media, None, layers)
    sent = out.detach().requires_grad_(out.requires_grad)  # what crosses to the LLM rank
    llm.set_encoder_inputs({"vision": sent})
    loss = llm(tokens, pos, media, labels=labels).sum()  # media: their counts
    loss.backward()
    if not frozen_vit:
        out.backward(sent.grad)  # the gradient sent back to the encoder rank
    torch.testing.assert_close(loss, ref)
    for m in (encoder, llm):
        for name, p in m.named_parameters():
            theirs = dict(whole.named_parameters())[name].grad
            assert (p.grad is None) == (theirs is None), name
            if theirs is not None:
                torch.testing.assert_close(p.grad, theirs, msg=name)

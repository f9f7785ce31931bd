"""Packed samples (--data-balance) on Transformer Engine's THD attention, on CPU: the LLM's
core attention replaced by the THD wrapper over a stand-in with TE's THD contract
(``te_stand_in.py``), a packed row through the TE code path (``PackedSequences`` from the
host cu_seqlens) equals the local path under the dense block-diagonal mask: losses and
gradients, with RoPE and with M-RoPE positions restarting per sample. The stand-in refuses
what TE refuses (int64 cu_seqlens, max_seqlen left for TE to read back)."""

import dataclasses

import pytest
import torch
from te_stand_in import StandInTEDotProductAttention
from tiny_multimodal import MEDIA_ID, tiny_config

# Three samples and a padding segment: 20 (an image: 16 tokens), 17, 19, 8 tokens.
CU = [0, 20, 37, 56, 64]


def _model(mrope: bool):
    from megatron_mm.models import BuildSettings, build_model

    config = tiny_config()
    if mrope:  # head dim 16: 8 rotary frequencies, split t / h / w
        config = dataclasses.replace(config, language=dataclasses.replace(
            config.language, position_embedding_type="mrope", mrope_section=(2, 3, 3)))
    torch.manual_seed(0)
    return build_model(config, BuildSettings(packed=True), {"image": MEDIA_ID})


def _thd_model(mrope: bool):
    """``_model(mrope)`` (the same weights) with its LLM layers attending through the THD
    wrapper over the stand-in (core attentions hold no parameters)."""
    from megatron_mm.models.packed_sequences import thd_attention

    thd = _model(mrope)
    for layer in thd.language_model.decoder.layers:
        old = layer.self_attention.core_attention
        layer.self_attention.core_attention = thd_attention(StandInTEDotProductAttention)(
            config=old.config, layer_number=old.layer_number,
            attn_mask_type=old.attn_mask_type, attention_type="self")
    return thd


def _batch(mrope: bool):
    gen = torch.Generator().manual_seed(3)
    s = CU[-1]
    tokens = torch.randint(0, 200, (1, s), generator=gen)
    tokens[0, 2:18] = MEDIA_ID
    lengths = [b - a for a, b in zip(CU, CU[1:])]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    if mrope:  # 3-D positions restarting per sample, the image's rows / columns apart
        positions = positions.expand(3, -1).clone()
        positions[1, 2:18] = torch.arange(16) // 4 + 2
        positions[2, 2:18] = torch.arange(16) % 4 + 2
        positions = positions[:, None]
    loss_mask = torch.ones(1, s)
    loss_mask[0, 56:] = 0  # the padding segment
    return {"tokens": tokens, "labels": torch.randint(0, 200, (1, s), generator=gen),
            "loss_mask": loss_mask, "position_ids": positions,
            "cu_seqlens": torch.tensor(CU, dtype=torch.int32),
            "media": {"image": torch.randn(1, 3, 16, 16, generator=gen)}}


def _loss_and_grads(model, batch, mask):
    model.zero_grad()
    loss = model(batch["tokens"], batch["position_ids"], batch["media"],
                 labels=batch["labels"], loss_mask=batch["loss_mask"], attention_mask=mask)
    total = (loss * batch["loss_mask"]).sum()
    total.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("mrope", [False, True], ids=["rope", "mrope"])
def test_packed_row_on_thd_equals_the_masked_local_path(gloo_world, mrope):
    from megatron_mm.models.packed_sequences import PackedSequences
    from megatron_mm.training.assembly.attention import AttentionSettings

    local, thd = _model(mrope), _thd_model(mrope)
    batch = _batch(mrope)
    dense = AttentionSettings({}).mask_for(batch)  # [1, 1, S, S] block-diagonal causal
    carrier = AttentionSettings({}, packed_thd=True).mask_for(batch)
    assert isinstance(carrier, PackedSequences) and carrier.thd.max_seqlen_q == 20
    ref_loss, ref_grads = _loss_and_grads(local, batch, dense)
    loss, grads = _loss_and_grads(thd, batch, carrier)
    calls = [layer.self_attention.core_attention.calls
             for layer in thd.language_model.decoder.layers]
    assert calls == [{"thd": 1, "sbhd": 0}] * 2, calls
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, value in ref_grads.items():
        torch.testing.assert_close(grads[name], value, rtol=1e-4, atol=1e-6, msg=name)
    # unpacked rows (validation, generation) take TE's usual causal path
    plain = {k: v for k, v in batch.items() if k != "cu_seqlens"}
    assert AttentionSettings({}, packed_thd=True).mask_for(plain) is None
    thd(plain["tokens"], plain["position_ids"], plain["media"])
    assert calls == [{"thd": 1, "sbhd": 1}] * 2, calls


def test_the_stand_in_refuses_what_te_refuses(gloo_world):
    from megatron_mm.models.packed_sequences import packed_sequences

    thd = _thd_model(False)
    batch = _batch(False)
    wrong_dtype = packed_sequences(batch["cu_seqlens"])
    wrong_dtype.thd.cu_seqlens_q = wrong_dtype.thd.cu_seqlens_kv = torch.tensor(CU)
    host_read = packed_sequences(batch["cu_seqlens"])
    host_read.thd.max_seqlen_q = None
    for carrier, message in ((wrong_dtype, "int32"), (host_read, "TE would read")):
        with pytest.raises(AssertionError, match=message):
            thd(batch["tokens"], batch["position_ids"], batch["media"],
                attention_mask=carrier)


def test_specs_pick_thd_for_packed_causal_rows_on_te(te_placeholder_specs, monkeypatch):
    from megatron.core.extensions import transformer_engine

    from megatron_mm.models.packed_sequences import THDAttention
    from megatron_mm.models.specs import uses_thd

    # a class to derive from where TE's placeholder is not one
    monkeypatch.setattr(transformer_engine, "TEDotProductAttention",
                        StandInTEDotProductAttention)

    def thd(specs):
        core = specs.language_layer.submodules.self_attention.submodules.core_attention
        return isinstance(core, type) and issubclass(core, THDAttention)

    te = te_placeholder_specs
    assert thd(te("transformer_engine", packed=True))
    # the dense mask as TE's arbitrary mask; CP: ours applies the packed mask
    assert not thd(te("transformer_engine", packed=True, media_attention="bidirectional"))
    assert not uses_thd("transformer_engine", "causal", packed=True, context_parallel=True)
    assert not thd(te("transformer_engine"))

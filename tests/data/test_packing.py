"""Packed sequences: the collated layout, and the same per-token losses as each sample run
alone (packed samples do not attend to each other)."""

import torch

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.data import Sample, collate, collate_packed

IMAGE_ID = 250


def packed_mask(batch):
    """The block-diagonal causal mask the training step makes from ``cu_seqlens``."""
    from megatron_mm.training.loop.step import CAUSAL
    return CAUSAL.mask_for(batch)


def _samples(n_tokens, images, lengths, gen):
    samples = []
    for k, (n_img, length) in enumerate(zip(images, lengths)):
        tokens = torch.randint(0, 200, (length,), generator=gen)
        tokens[2:2 + n_img * n_tokens] = IMAGE_ID
        labels = torch.randint(0, 200, (length,), generator=gen)
        loss_mask = (torch.rand(length, generator=gen) > 0.3).float()
        loss_mask[-1] = 0  # as encode_record: the last token predicts nothing
        loss_mask[2:2 + n_img * n_tokens] = 0
        samples.append(Sample(tokens, labels, loss_mask,
                              {"image": torch.randn(n_img, 3, 16, 16, generator=gen)},
                              record_id=f"s{k}"))
    return samples


def test_packed_losses_equal_each_sample_alone(gloo_world):
    from megatron_mm.models import BuildSettings, build_model

    enc = VisionEncoderConfig(hidden_size=32, num_layers=2, num_attention_heads=2, img_h=16,
                              img_w=16, patch_dim=8, drop_class_token=True)
    cfg = MultimodalModelConfig(
        encoders={"vision": enc},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4,
                                     num_query_groups=2, num_layers=2))
    model = build_model(cfg, BuildSettings(), {"image": IMAGE_ID}).eval()
    gen = torch.Generator().manual_seed(0)
    samples = _samples(enc.num_output_tokens, [1, 3, 0, 2], [19, 23, 9, 17], gen)
    batch = collate_packed(samples, pad_id=0)
    assert batch["tokens"].shape == (1, 68) and batch["cu_seqlens"].tolist() == [0, 19, 42,
                                                                                 51, 68]
    assert batch["position_ids"][0, 19:23].tolist() == [0, 1, 2, 3]
    assert batch["media"]["image"].shape[0] == 6 and batch["record_ids"][1] == "s1"

    def run(b, mask):
        with torch.no_grad():
            return model(b["tokens"], b["position_ids"], b["media"], labels=b["labels"],
                         loss_mask=b["loss_mask"], attention_mask=mask)

    packed = run(batch, packed_mask(batch))[0]
    causal_only = run(batch, None)[0]
    cu = batch["cu_seqlens"].tolist()
    for k, s in enumerate(samples):
        alone = collate_packed([s], pad_id=0)
        ref = run(alone, None)[0]
        torch.testing.assert_close(packed[cu[k]:cu[k + 1]], ref, rtol=1e-5, atol=1e-5)
    # Without the block mask later samples see earlier ones: their losses change.
    assert not torch.allclose(causal_only[cu[1]:], packed[cu[1]:], atol=1e-4)


def test_padding_segment_makes_the_length_a_multiple():
    """--sequence-parallel: a packed length short of a multiple of TP gets a padding
    segment of its own (pad tokens, no loss, attending only to itself)."""
    gen = torch.Generator().manual_seed(0)
    samples = _samples(4, [1, 0], [9, 4], gen)
    batch = collate_packed(samples, pad_id=7, pad_to_multiple_of=4)
    assert batch["tokens"].shape == (1, 16)
    assert batch["cu_seqlens"].tolist() == [0, 9, 13, 16]
    assert batch["tokens"][0, 13:].tolist() == [7, 7, 7]
    assert batch["loss_mask"][0, 13:].sum() == 0
    assert batch["position_ids"][0, 13:].tolist() == [0, 1, 2]
    assert batch["record_ids"] == ["s0", "s1"]  # the padding is no record
    unpadded = collate_packed(samples, pad_id=7, pad_to_multiple_of=13)
    assert unpadded["tokens"].shape == (1, 13) and len(unpadded["cu_seqlens"]) == 3


def test_packed_mrope_positions_concatenate():
    """Samples with 3-D positions pack to [3, 1, S]: each sample's own, in order; text-only
    samples and the padding segment count 0, 1, ... on every axis."""
    gen = torch.Generator().manual_seed(0)
    samples = _samples(4, [1, 0], [9, 4], gen)
    samples[0].position_ids = torch.stack([torch.zeros(9), torch.arange(9),
                                           torch.arange(9) % 3]).long()
    batch = collate_packed(samples, pad_id=7, pad_to_multiple_of=4)
    pos = batch["position_ids"]
    assert pos.shape == (3, 1, 16)
    assert torch.equal(pos[:, 0, :9], samples[0].position_ids)
    assert torch.equal(pos[:, 0, 9:13], torch.arange(4).expand(3, -1))
    assert torch.equal(pos[:, 0, 13:], torch.arange(3).expand(3, -1))


def test_packed_mrope_losses_equal_each_sample_alone(gloo_world):
    """M-RoPE: a packed sample's tokens rotate at its own 3-D positions, so its losses are
    those of the sample run alone (and not those at text positions)."""
    from megatron_mm.models import BuildSettings, build_model

    enc = VisionEncoderConfig(hidden_size=32, num_layers=1, num_attention_heads=2, img_h=16,
                              img_w=16, patch_dim=8, drop_class_token=True)
    cfg = MultimodalModelConfig(
        encoders={"vision": enc},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4,
                                     position_embedding_type="mrope", mrope_section=(2, 3, 3)))
    model = build_model(cfg, BuildSettings(), {"image": IMAGE_ID}).eval()
    with torch.no_grad():  # sharp attention: the rotation angles show in the losses
        for layer in model.language_model.decoder.layers:
            layer.self_attention.linear_qkv.weight.mul_(8.0)
    gen = torch.Generator().manual_seed(0)
    samples = _samples(enc.num_output_tokens, [1, 2, 0], [13, 17, 9], gen)
    for s in samples:
        n = len(s.tokens)
        s.position_ids = torch.stack([torch.arange(n), torch.arange(n) + s.tokens % 4,
                                      2 * torch.arange(n) + s.tokens % 3])
    batch = collate_packed(samples, pad_id=0)

    def run(b, mask=None):
        with torch.no_grad():
            return model(b["tokens"], b["position_ids"], b["media"], labels=b["labels"],
                         loss_mask=b["loss_mask"], attention_mask=mask)[0]

    packed = run(batch, packed_mask(batch))
    cu = batch["cu_seqlens"].tolist()
    for k, s in enumerate(samples):
        torch.testing.assert_close(packed[cu[k]:cu[k + 1]], run(collate([s], pad_id=0)),
                                   rtol=1e-5, atol=1e-5)
    text = run({**batch, "position_ids": torch.arange(cu[-1])[None]}, packed_mask(batch))
    assert not torch.allclose(text, packed, atol=1e-3)

"""The mask each micro-batch gets from the flags (one process, no context parallelism)."""

import numpy as np
import torch

from megatron_mm.plan.context_parallel.attention_mask import dense_allowed, encode
from megatron_mm.training.assembly.attention import AttentionSettings

IMG = 50


def _batch(tokens, **extra):
    return {"tokens": torch.tensor(tokens), **extra}


def test_causal_media_keeps_todays_masks():
    """Causal: Megatron's own mask (None); packed samples: block-diagonal causal, each
    sample seeing only its own earlier tokens."""
    settings = AttentionSettings({IMG: 2})
    assert settings.mask_for(_batch([[1, IMG, IMG, 2]])) is None
    packed = settings.mask_for(_batch([[1, IMG, IMG, 4, 5]], cu_seqlens=torch.tensor([0, 2, 5])))
    allowed = torch.tensor([[1, 0, 0, 0, 0],
                            [1, 1, 0, 0, 0],
                            [0, 0, 1, 0, 0],
                            [0, 0, 1, 1, 0],
                            [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert packed.shape == (1, 1, 5, 5) and torch.equal(~packed[0, 0], allowed)


def test_dense_masks_are_made_on_the_device_from_codes():
    """Only the [B, S] codes cross to the device: the [B, 1, S, S] mask is made there."""
    from host_syncs import count_during

    settings = AttentionSettings({IMG: 2}, media_attention="bidirectional")
    batch = _batch([[1, IMG, IMG, 2]])
    mask, counter = count_during(lambda: settings.mask_for(batch, device="cpu"),
                                 host_work=True, host=[batch["tokens"]])
    assert counter.found == [] and mask.shape == (1, 1, 4, 4)


def test_bidirectional_media_dense_mask():
    settings = AttentionSettings({IMG: 2}, media_attention="bidirectional")
    mask = settings.mask_for(_batch([[1, IMG, IMG, 2], [IMG, IMG, 3, 4]]))
    expected = ~dense_allowed(encode(np.zeros((2, 4), int), [[0, 1, 1, 0], [1, 1, 0, 0]]))
    assert mask.shape == (2, 1, 4, 4)
    assert (mask[:, 0].numpy() == expected).all()


def test_packed_batch_documents_from_cu_seqlens():
    # Two packed samples: [t I I] [t t]; the image sees itself, nothing crosses samples.
    settings = AttentionSettings({IMG: 2}, media_attention="bidirectional")
    batch = _batch([[1, IMG, IMG, 3, 4]], cu_seqlens=torch.tensor([0, 3, 5]))
    allowed = ~settings.mask_for(batch)[0, 0]
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [0, 1, 1, 0, 0],
                             [0, 1, 1, 0, 0],
                             [0, 0, 0, 1, 0],
                             [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert (allowed == expected).all()


def test_flexattention_gets_the_codes_not_a_dense_mask():
    """With FlexAttention chosen, a whole micro-batch's mask is its [B, S] codes on the
    device (MaskCodes), from which the block mask is built; causal batches stay None."""
    from megatron_mm.models.flex_attention import MaskCodes

    settings = AttentionSettings({IMG: 2}, media_attention="bidirectional",
                                 cp_attention="flex")
    mask = settings.mask_for(_batch([[1, IMG, IMG, 2]]), device="cpu")
    assert isinstance(mask, MaskCodes) and mask.codes.shape == (1, 4)
    np.testing.assert_array_equal(mask.codes.numpy(), [[0, 1, 1, 0]])
    causal = AttentionSettings({IMG: 2}, cp_attention="flex")
    assert causal.mask_for(_batch([[1, IMG, IMG, 2]])) is None

"""The compact multimodal mask against hand-written dense masks and its own dense
reference (row intervals, tiles)."""

import numpy as np
import pytest

from megatron_mm.plan.context_parallel.attention_mask import (dense_allowed, encode, key_intervals,
                                                              mask_codes, media_items, tile_map)
from megatron_mm.reproductions.mask_families import FAMILIES, family_codes

IMG = 9  # placeholder id, 2 tokens per item


def rows(*lines):
    return np.array([[c == "1" for c in line] for line in lines])


def test_text_only_is_causal():
    codes = mask_codes(np.array([1, 2, 3, 4]), {IMG: 2})
    assert (dense_allowed(codes) == np.tril(np.ones((4, 4), bool))).all()


def test_media_item_bidirectional_text_sees_everything_before():
    # t I I t : the image's two tokens see each other only; text is causal.
    codes = mask_codes(np.array([1, IMG, IMG, 2]), {IMG: 2})
    expected = rows("1000",
                    "0110",
                    "0110",
                    "1111")
    assert (dense_allowed(codes) == expected).all()


def test_adjacent_images_are_separate_items():
    # t I I I I t : two items back to back never see each other.
    codes = mask_codes(np.array([1, IMG, IMG, IMG, IMG, 2]), {IMG: 2})
    assert list(media_items(np.array([1, IMG, IMG, IMG, IMG, 2]), {IMG: 2})) == [
        0, 1, 1, 2, 2, 0]
    expected = rows("100000",
                    "011000",
                    "011000",
                    "000110",
                    "000110",
                    "111111")
    assert (dense_allowed(codes) == expected).all()


def test_packed_documents_never_attend_to_each_other():
    # doc 0: t I I ; doc 1: t t
    tokens = np.array([1, IMG, IMG, 3, 4])
    codes = mask_codes(tokens, {IMG: 2}, doc_ids=np.array([0, 0, 0, 1, 1]))
    expected = rows("10000",
                    "01100",
                    "01100",
                    "00010",
                    "00011")
    assert (dense_allowed(codes) == expected).all()


def test_causal_media_attention_is_plain_causal_per_document():
    tokens = np.array([1, IMG, IMG, 3, 4])
    codes = mask_codes(tokens, {IMG: 2}, doc_ids=np.array([0, 0, 0, 1, 1]),
                       media_attention="causal")
    expected = rows("10000",
                    "11000",
                    "11100",
                    "00010",
                    "00011")
    assert (dense_allowed(codes) == expected).all()


def test_bad_media_attention_names_the_flag():
    with pytest.raises(ValueError, match="--media-attention"):
        mask_codes(np.array([1]), {}, media_attention="sideways")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_intervals_and_tiles_match_the_dense_reference(family):
    codes = family_codes(family, 200, seed=3)
    allowed = dense_allowed(codes)
    lo, hi = key_intervals(codes)
    cols = np.arange(200)
    # Every row is exactly one contiguous interval.
    assert (allowed == ((cols[None] >= lo[:, None]) & (cols[None] <= hi[:, None]))).all()
    block = 16
    nb = -(-200 // block)
    padded = np.zeros((nb * block, nb * block), bool)
    padded[:200, :200] = allowed
    dense_tiles = padded.reshape(nb, block, nb, block).any(axis=(1, 3))
    assert (tile_map(codes, block) == dense_tiles).all()


def test_batch_of_rows():
    tokens = np.array([[1, IMG, IMG, 2], [IMG, IMG, 1, 2]])
    codes = mask_codes(tokens, {IMG: 2})
    assert codes.shape == (2, 4)
    assert (dense_allowed(codes)[1] == rows("1100", "1100", "1110", "1111")).all()
    assert (codes == encode(np.zeros((2, 4), int), [[0, 1, 1, 0], [1, 1, 0, 0]])).all()

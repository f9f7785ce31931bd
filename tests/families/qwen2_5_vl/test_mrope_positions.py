"""Host-side M-RoPE position ids equal transformers' ``Qwen2_5_VLModel.get_rope_index`` on a
real (tiny) model, for batches that mix text, images of different sizes and videos, with
left and right padding; per-sample positions are the batch's rows."""

import numpy as np
import pytest
import torch

from megatron_mm.families.qwen2_5_vl.mrope_positions import (batch_mrope_positions,
                                                             sample_mrope_positions, token_kinds)
from megatron_mm.data.records import DataRecordError

IMG, VID, START, END = 250, 251, 252, 253


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    def build(tokens_per_second):
        cfg = Qwen2_5_VLConfig(
            text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=16, vocab_size=256,
                             bos_token_id=0, eos_token_id=1,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                              "mrope_section": [1, 1, 2]}),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                               out_hidden_size=16, window_size=56, fullatt_block_indexes=[0],
                               tokens_per_second=tokens_per_second),
            image_token_id=IMG, video_token_id=VID, vision_start_token_id=START,
            vision_end_token_id=END, bos_token_id=0, eos_token_id=1)
        return Qwen2_5_VLModel(cfg).eval()
    return build


def _item(token, grid):
    t, h, w = grid
    return [START] + [token] * (t * h * w // 4) + [END]


def _batch(rows, pad_left):
    """Token rows padded to one length (pad id 0), and the attention mask."""
    seq = max(len(r) for r in rows) + 3
    ids = np.zeros((len(rows), seq), dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, (row, left) in enumerate(zip(rows, pad_left)):
        sl = slice(seq - len(row), seq) if left else slice(0, len(row))
        ids[b, sl] = row
        mask[b, sl] = 1
    return ids, mask


def _hf(model, ids, mask, images, videos, seconds):
    kinds = torch.from_numpy(token_kinds(ids, IMG, VID))
    pos, deltas = model.get_rope_index(
        torch.from_numpy(ids), kinds,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
        second_per_grid_ts=torch.tensor(seconds, dtype=torch.float32) if videos else None,
        attention_mask=None if mask is None else torch.from_numpy(mask))
    return pos.numpy(), deltas.numpy()


# images [1,4,6] and [1,8,4] (different sizes), videos [3,4,4] and [4,2,6]
IMAGES = [[1, 4, 6], [1, 8, 4]]
VIDEOS = [[3, 4, 4], [4, 2, 6]]
ROWS = [
    [7, 8] + _item(IMG, IMAGES[0]) + [9] + _item(VID, VIDEOS[0]) + [10, 11] +
    _item(IMG, IMAGES[1]) + [12],
    [13] + _item(VID, VIDEOS[1]) + [14, 15, 16],
    [17, 18, 19, 20],  # text only
]


@pytest.mark.parametrize("tokens_per_second,fps", [(2, 2.0), (2, 3.0), (25, 0.5), (4, 7.0)])
@pytest.mark.parametrize("padding", ["right", "left", "mixed", "none"])
def test_batch_equals_transformers(hf_model, tokens_per_second, fps, padding):
    model = hf_model(tokens_per_second)
    seconds = [2 / fps, 2 / (fps + 1)]
    rows = ROWS if padding != "none" else [ROWS[0]]
    pad_left = {"right": [0, 0, 0], "left": [1, 1, 1], "mixed": [0, 1, 0],
                "none": [0]}[padding]
    ids, mask = _batch(rows, pad_left)
    if padding == "none":
        ids, mask = ids[:, :len(rows[0])], None
    videos = VIDEOS if padding != "none" else VIDEOS[:1]
    want, want_deltas = _hf(model, ids, mask, IMAGES, videos, seconds[:len(videos)])
    got, deltas = batch_mrope_positions(
        ids, image_token_id=IMG, video_token_id=VID, image_grid_thw=IMAGES,
        video_grid_thw=videos, second_per_grid_ts=seconds[:len(videos)],
        attention_mask=mask, tokens_per_second=tokens_per_second)
    assert got.dtype == np.int64 and got.shape == (3, *ids.shape)
    assert np.array_equal(got, want)
    assert np.array_equal(deltas, want_deltas)
    # one sample at a time gives the batch's rows (what a collator or packer uses)
    items = [(IMAGES, VIDEOS[:1]), ([], VIDEOS[1:]), ([], [])]
    for b in range(ids.shape[0]):
        imgs, vids = items[b]
        pos, delta = sample_mrope_positions(
            ids[b], image_token_id=IMG, video_token_id=VID, image_grid_thw=imgs or None,
            video_grid_thw=vids or None,
            second_per_grid_ts=[seconds[VIDEOS.index(v)] for v in vids],
            attention_mask=None if mask is None else mask[b],
            tokens_per_second=tokens_per_second)
        assert np.array_equal(pos, want[:, b]) and delta == want_deltas[b, 0]


def test_images_only_batch_equals_transformers(hf_model):
    model = hf_model(2)
    rows = [[5] + _item(IMG, IMAGES[1]) + [6], _item(IMG, IMAGES[0]) + [8, 9]]
    ids, mask = _batch(rows, [1, 0])
    want, want_deltas = _hf(model, ids, mask, IMAGES[::-1], [], [])
    got, deltas = batch_mrope_positions(ids, image_token_id=IMG, video_token_id=VID,
                                        image_grid_thw=IMAGES[::-1], attention_mask=mask,
                                        tokens_per_second=2)
    assert np.array_equal(got, want) and np.array_equal(deltas, want_deltas)


def test_worked_example():
    # "a <img 1x4x4> b <video 2x4x4 at 1 s per temporal patch, 2 tokens/s> c"
    ids = [1] + [IMG] * 4 + [2] + [VID] * 8 + [3]
    pos, delta = sample_mrope_positions(ids, image_token_id=IMG, video_token_id=VID,
                                        image_grid_thw=[[1, 4, 4]], video_grid_thw=[[2, 4, 4]],
                                        second_per_grid_ts=[1.0], tokens_per_second=2)
    assert pos.tolist() == [
        [0, 1, 1, 1, 1, 3, 4, 4, 4, 4, 6, 6, 6, 6, 6],
        [0, 1, 1, 2, 2, 3, 4, 4, 5, 5, 4, 4, 5, 5, 6],
        [0, 1, 2, 1, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6]]
    assert delta == 7 - 15
    # transformers 4.x / Qwen's original code: text after a video starts after its largest
    # position (here the temporal 6), not at start + max(h, w) / merge
    legacy, _ = sample_mrope_positions(ids, image_token_id=IMG, video_token_id=VID,
                                       image_grid_thw=[[1, 4, 4]], video_grid_thw=[[2, 4, 4]],
                                       second_per_grid_ts=[1.0], tokens_per_second=2,
                                       legacy_text_after_video=True)
    assert legacy[:, :-1].tolist() == pos[:, :-1].tolist() and legacy[:, -1].tolist() == [7] * 3


def test_touching_items_are_split_by_their_grids():
    # two images with no token between them: the second starts at first start + 2
    ids = [IMG] * 4 + [IMG] * 2 + [5]
    pos, _ = sample_mrope_positions(ids, image_token_id=IMG, video_token_id=VID,
                                    image_grid_thw=[[1, 4, 4], [1, 2, 4]], tokens_per_second=2)
    assert pos.tolist() == [[0, 0, 0, 0, 2, 2, 4], [0, 0, 1, 1, 2, 2, 4],
                            [0, 1, 0, 1, 2, 3, 4]]


def test_mismatched_placeholders_and_grids_are_named():
    kw = dict(image_token_id=IMG, video_token_id=VID, tokens_per_second=2,
              context="record 'r3'")
    with pytest.raises(DataRecordError, match=r"record 'r3': image 0 with grid \(1, 4, 4\) "
                                              r"needs 4 placeholder tokens but only 3 follow"):
        sample_mrope_positions([1] + [IMG] * 3, image_grid_thw=[[1, 4, 4]], **kw)
    with pytest.raises(DataRecordError, match=r"record 'r3': 2 image grids given but the "
                                              r"tokens hold placeholders for 1"):
        sample_mrope_positions([1] + [IMG] * 4, image_grid_thw=[[1, 4, 4]] * 2, **kw)
    with pytest.raises(DataRecordError, match=r"record 'r3': video placeholder tokens at "
                                              r"positions 1..2 have no video grid left"):
        sample_mrope_positions([1, VID, VID], **kw)
    with pytest.raises(DataRecordError, match=r"batch: 2 video grids given but the batch's "
                                              r"tokens hold placeholders for 1"):
        batch_mrope_positions(np.array([[1] + [VID] * 4]), image_token_id=IMG,
                              video_token_id=VID, video_grid_thw=[[1, 4, 4]] * 2,
                              second_per_grid_ts=[1.0, 1.0], tokens_per_second=2)


@pytest.mark.parametrize("fps,frames", [(7.75, 34), (2.75, 12)])
def test_temporal_positions_use_the_reference_float32_arithmetic(hf_model, fps, frames):
    # at 25 tokens/s float64 would put a temporal patch one position later: at 7.75 fps
    # through the interval (25 * 2 / fps), at 2.75 fps through the product (i * interval)
    model = hf_model(25)
    grid = [frames, 2, 2]
    ids = np.array([[3] + _item(VID, grid) + [4]])
    want, want_deltas = _hf(model, ids, None, [], [grid], [2 / fps])
    got, deltas = batch_mrope_positions(ids, image_token_id=IMG, video_token_id=VID,
                                        video_grid_thw=[grid], second_per_grid_ts=[2 / fps],
                                        tokens_per_second=25)
    assert np.array_equal(got, want) and np.array_equal(deltas, want_deltas)

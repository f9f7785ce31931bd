"""Host-side M-RoPE position ids equal transformers' ``Qwen3VLModel.get_rope_index`` on a
real (tiny) model: text, two images of different sizes and videos whose frames come each
after its timestamp text (as ``Qwen3VLProcessor`` writes them), with left, right and no
padding; each row computed alone equals the batch's row."""

import numpy as np
import pytest
import torch

from megatron_mm.families.qwen2_5_vl.mrope_positions import token_kinds
from megatron_mm.families.qwen3_vl.mrope_positions import (qwen3_vl_batch_positions,
                                                           qwen3_vl_sample_positions)

IMG, VID, START, END = 250, 251, 252, 253
TIME = [7, 8, 9]  # "<0.5 seconds>": a few text tokens before each frame


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    cfg = Qwen3VLConfig(
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=16,
                         vocab_size=256, rope_parameters={"rope_type": "default",
                                                          "rope_theta": 1e4,
                                                          "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                           out_hidden_size=16, num_position_embeddings=16,
                           deepstack_visual_indexes=[0]),
        image_token_id=IMG, video_token_id=VID, vision_start_token_id=START,
        vision_end_token_id=END)
    return Qwen3VLModel(cfg).eval()


def _image(grid):
    t, h, w = grid
    return [START] + [IMG] * (t * h * w // 4) + [END]


def _video(grid):
    """Each temporal patch: its timestamp text, then its tokens between vision tags."""
    t, h, w = grid
    return [tok for _ in range(t) for tok in TIME + [START] + [VID] * (h * w // 4) + [END]]


def _batch(rows, pad_left):
    seq = max(len(r) for r in rows) + 3
    ids = np.zeros((len(rows), seq), dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, (row, left) in enumerate(zip(rows, pad_left)):
        sl = slice(seq - len(row), seq) if left else slice(0, len(row))
        ids[b, sl] = row
        mask[b, sl] = 1
    return ids, mask


IMAGES = [(1, 8, 12), (1, 4, 4), (1, 6, 2)]
VIDEOS = [(3, 4, 6), (2, 2, 8)]


@pytest.mark.parametrize("pad_left", [(False, False), (True, False), (True, True)])
def test_positions_equal_get_rope_index(hf_model, pad_left):
    rows = [[1, 2] + _image(IMAGES[0]) + [3] + _video(VIDEOS[0]) + [4, 5] + _image(IMAGES[1]),
            _video(VIDEOS[1]) + [6] + _image(IMAGES[2]) + [2, 3, 4]]
    ids, mask = _batch(rows, pad_left)
    want, want_delta = hf_model.get_rope_index(
        torch.from_numpy(ids), torch.from_numpy(token_kinds(ids, IMG, VID)),
        image_grid_thw=torch.tensor(IMAGES), video_grid_thw=torch.tensor(VIDEOS),
        attention_mask=torch.from_numpy(mask))
    got, delta = qwen3_vl_batch_positions(ids, image_token_id=IMG, video_token_id=VID,
                                          image_grid_thw=IMAGES, video_grid_thw=VIDEOS,
                                          attention_mask=mask)
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(delta, want_delta.numpy())
    assert len(np.unique(got[0])) != len(np.unique(got[1]))  # truly 3-D positions
    per_row = (([IMAGES[0], IMAGES[1]], [VIDEOS[0]]), ([IMAGES[2]], [VIDEOS[1]]))
    for b, (images, videos) in enumerate(per_row):
        alone, _ = qwen3_vl_sample_positions(ids[b], image_token_id=IMG, video_token_id=VID,
                                             image_grid_thw=images, video_grid_thw=videos,
                                             attention_mask=mask[b])
        np.testing.assert_array_equal(alone, got[:, b])


def test_text_only_rows_count_on(hf_model):
    ids = np.arange(3, 12)[None]
    got, delta = qwen3_vl_batch_positions(ids, image_token_id=IMG, video_token_id=VID)
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(9), (3, 1, 9)))
    assert delta.tolist() == [[0]]

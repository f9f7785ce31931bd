"""Qwen2.5-VL records: two images of different sizes and a video (frame files with an fps)
in one record, each placeholder expanded to its item's exact token count, media in the
batch as the encoder reads them, M-RoPE positions per sample; bad items and overlong
samples refused naming the record."""

import pytest
import torch
from PIL import Image

from megatron_mm.families.qwen2_5_vl.media_processor import qwen_vl_processor
from megatron_mm.families.qwen2_5_vl.mrope_positions import sample_mrope_positions
from megatron_mm.data.processing import collate, encode_record
from megatron_mm.families.qwen2_5_vl.media import process_media
from megatron_mm.data.records import DataRecordError
from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
from media_files import write_image as _image, write_records as _records

ENC = Qwen2_5VLVisionConfig(hidden_size=32, num_layers=2, num_attention_heads=4,
                            fullatt_block_indexes=(1,),
                            out_hidden_size=64, min_pixels=28 * 28, max_pixels=112 * 112,
                            video_min_pixels=28 * 28, video_max_pixels=56 * 56,
                            tokens_per_second=2.0)


class _Args:
    image_processor_config = None


@pytest.fixture(scope="module")
def procs():
    image, video = qwen_vl_processor(_Args(), ENC)
    return {"image": image, "video": video}


@pytest.fixture(scope="module")
def tok():
    from megatron_mm.data.tokenizer import build_tokenizer

    return build_tokenizer()


def _mixed(tmp_path, frames=2):
    a = _image(tmp_path / "a.png", 90, 60, 0)
    b = _image(tmp_path / "b.png", 40, 70, 1)
    clip = [_image(tmp_path / f"f{i}.png", 64, 48, 10 + i) for i in range(frames)]
    return {"id": "mixed", "conversations": [
        {"from": "human", "value": "<image> then <video> and <image>?"},
        {"from": "gpt", "value": "yes"}],
        "images": [a, b], "videos": [{"frames": clip, "fps": 4}]}


def test_record_with_two_images_and_a_video(tmp_path, tok, procs):
    (record,) = _records(tmp_path, [_mixed(tmp_path)])
    counts = {m: p.token_count for m, p in procs.items()}
    sample = encode_record(record, tok, counts, None, max_seq_length=512, processors=procs)
    images = [Image.open(tmp_path / n) for n in ("a.png", "b.png")]
    frames = [Image.open(tmp_path / f"f{i}.png") for i in range(2)]
    expected = process_media(images, [(frames, 4)], procs["image"].cfg)
    media = sample.media
    torch.testing.assert_close(media["image"], expected.pixel_values, rtol=0, atol=0)
    torch.testing.assert_close(media["video"], expected.pixel_values_videos, rtol=0, atol=0)
    assert media["image_grid_thw"].tolist() == expected.image_grid_thw.tolist()
    assert media["video_grid_thw"].tolist() == expected.video_grid_thw.tolist()
    ids = sample.tokens.tolist()
    image_id, video_id = tok.media_token_id("image"), tok.media_token_id("video")
    # each placeholder in text order: image 0, the video, image 1, their exact counts
    runs, prev = [], None
    for t in ids:
        if t in (image_id, video_id):
            if prev == t:
                runs[-1][1] += 1
            else:
                runs.append([t, 1])
        prev = t
    assert runs == [[image_id, expected.image_tokens[0]], [video_id, expected.video_tokens[0]],
                    [image_id, expected.image_tokens[1]]]
    assert expected.image_tokens[0] != expected.image_tokens[1]  # two sizes
    pos, _ = sample_mrope_positions(
        ids, image_token_id=image_id, video_token_id=video_id,
        image_grid_thw=expected.image_grid_thw.tolist(),
        video_grid_thw=expected.video_grid_thw.tolist(),
        second_per_grid_ts=expected.second_per_grid_ts.tolist(), tokens_per_second=2.0)
    assert sample.position_ids.tolist() == pos.tolist()
    assert not (sample.position_ids[0] == sample.position_ids[1]).all()  # 3-D on media

    text = encode_record(_records(tmp_path, [{"id": "t", "text": "plain"}])[0], tok, counts,
                         None, processors=procs)
    batch = collate([sample, text], tok.pad_id)
    assert batch["position_ids"].shape == (3, 2, len(ids))
    assert batch["media"]["image_grid_thw"].shape == (2, 3)
    assert batch["media"]["second_per_grid_ts"].tolist() == [0.5]


def test_bad_items_and_overlong_samples_name_the_record(tmp_path, tok, procs):
    counts = {m: p.token_count for m, p in procs.items()}
    small = _image(tmp_path / "small.png", 20, 50, 3)
    (rec,) = _records(tmp_path, [{"id": "tiny", "text": "<image>", "images": [small]}])
    with pytest.raises(DataRecordError, match="'tiny'.*below the minimum"):
        encode_record(rec, tok, counts, None, processors=procs)
    (rec,) = _records(tmp_path, [_mixed(tmp_path, frames=3)])
    with pytest.raises(DataRecordError, match="'mixed'.*3 frames.*temporal"):
        encode_record(rec, tok, counts, None, processors=procs)
    (rec,) = _records(tmp_path, [_mixed(tmp_path)])
    n = len(encode_record(rec, tok, counts, None, processors=procs).tokens)  # expanded
    with pytest.raises(DataRecordError, match=f"'mixed'.*{n} tokens exceed "
                                              f"max_seq_length={n - 1}"):
        encode_record(rec, tok, counts, None, max_seq_length=n - 1, processors=procs)
    for video, what in (({"frames": []}, "non-empty 'frames'"),
                        ({"frames": [small]}, "positive 'fps'")):
        with pytest.raises(DataRecordError, match=what):
            _records(tmp_path, [{"id": "v", "text": "<video>", "videos": [video]}])

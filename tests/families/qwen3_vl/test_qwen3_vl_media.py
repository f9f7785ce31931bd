"""Qwen3-VL's media equal transformers': the video rule (frame sampling, the resize of the
whole clip, grids, timestamps) against ``Qwen3VLVideoProcessor`` and ``Qwen3VLProcessor``'s
own functions, and a record of two images and a video against ``Qwen3VLProcessor``
(``input_ids``, ``mm_token_type_ids``, pixels, grids) and ``Qwen3VLModel.get_rope_index``;
bad items refused naming the record."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_mm.data.item_tags import tag_request
from megatron_mm.data.processing import encode_record
from megatron_mm.data.records import DataRecordError
from megatron_mm.families.qwen2_5_vl.geometry import QwenVLGeometry
from megatron_mm.families.qwen2_5_vl.mrope_positions import token_kinds
from megatron_mm.families.qwen3_vl.config import Qwen3VLVisionConfig
from megatron_mm.families.qwen3_vl.media_processor import qwen3_vl_processor
from megatron_mm.families.qwen3_vl.video import (VideoSampling, plan_video, sample_indices,
                                                 smart_resize)
from megatron_mm.families.registry import FAMILIES
from media_files import write_image as _png, write_records as _records

ENC = Qwen3VLVisionConfig(hidden_size=32, num_layers=2, num_attention_heads=2,
                          ffn_hidden_size=64, out_hidden_size=64, num_position_embeddings=16,
                          deepstack_visual_indexes=(0,), min_pixels=32 * 32,
                          max_pixels=128 * 128, video_min_pixels=2 * 32 * 32,
                          video_max_pixels=4 * 64 * 96)


def _hf_video_processor(**kwargs):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    return Qwen3VLVideoProcessor(**kwargs)


# (frames, fps, height, width, sampling): fps-sampled (fewer, as many, more frames than
# min_frames), a fixed num_frames, an odd count, small frames scaled up, a clip over the
# pixel budget, one under it
CLIPS = [(10, 4.0, 64, 96, {}), (4, 2.0, 64, 64, {}), (2, 2.0, 32, 32, {}),
         (40, 30.0, 90, 150, {}), (9, 3.0, 70, 50, {"num_frames": 5}),
         (7, 1.0, 20, 90, {"min_frames": 3}), (30, 24.0, 300, 400, {"max_frames": 6}),
         (3, 2.0, 100, 41, {"fps": 1.5})]


@pytest.mark.parametrize("total,fps,height,width,kw", CLIPS)
def test_video_rule_equals_transformers(total, fps, height, width, kw):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import \
        smart_resize as hf_smart_resize
    from transformers.video_utils import VideoMetadata

    hf = _hf_video_processor(patch_size=16, cap_pixels_per_frame=False,
                             size={"shortest_edge": 2 * 32 * 32, "longest_edge": 4 * 64 * 96},
                             **{k: v for k, v in kw.items() if k != "num_frames"})
    sampling = VideoSampling(**kw)
    want = hf.sample_frames(VideoMetadata(total_num_frames=total, fps=fps),
                            num_frames=kw.get("num_frames"))
    assert sample_indices(total, fps, sampling) == want.tolist()
    geo = QwenVLGeometry(patch_size=16, video_min_pixels=2 * 32 * 32,
                         video_max_pixels=4 * 64 * 96)
    plan = plan_video(total, height, width, fps, geo, sampling)
    n = len(want)
    assert plan.size == hf_smart_resize(n, height, width, temporal_factor=2, factor=32,
                                        min_pixels=2 * 32 * 32, max_pixels=4 * 64 * 96)
    t, h, w = plan.grid
    assert t * h * w == hf.get_num_of_video_patches(n, height, width)
    times = Qwen3VLProcessor._calculate_timestamps(None, want.tolist(), fps, 2)
    assert plan.timestamps == tuple(f"<{s:.1f} seconds>" for s in times)


def test_smart_resize_scales_small_frames_as_transformers():
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import \
        smart_resize as hf_smart_resize

    for n, h, w in ((2, 9, 14), (3, 31, 500), (4, 1000, 33), (5, 64, 64), (2, 400, 10)):
        for bounds in ((1024, 4096), (2 * 32 * 32, 16 * 32 * 32), (100, 10 ** 7)):
            assert smart_resize(n, h, w, 2, 32, *bounds) == \
                hf_smart_resize(n, h, w, temporal_factor=2, factor=32, min_pixels=bounds[0],
                                max_pixels=bounds[1]), (n, h, w, bounds)


def _word_tokenizer(folder):
    """A word-level fast tokenizer with Qwen's vision tokens, saved to ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["USER", "ASSISTANT", ":", "compare", "and", "7", "seconds", "<", ">", "."]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words + list("0123456789"))}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<|endoftext|>", "<|vision_start|>", "<|vision_end|>",
                                "<|image_pad|>", "<|video_pad|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]",
                                  eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    return tok


def _unpatchify_image_rows(rows, gh, gw, p):
    """The image processor's rows of one frame (temporal copy 0) -> [3, gh*p, gw*p]."""
    x = rows.reshape(gh // 2, gw // 2, 2, 2, 3, 2, p, p)[:, :, :, :, :, 0]
    return x.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * p, gw * p)


@pytest.fixture
def qwen3(tmp_path, monkeypatch):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
        Qwen3VLVideoProcessor, smart_resize as hf_smart_resize)

    from megatron_mm.data.hf_tokenizer import HuggingFaceTokenizer

    half = [0.5, 0.5, 0.5]
    image_proc = Qwen2VLImageProcessorPil(patch_size=16, min_pixels=ENC.min_pixels,
                                          max_pixels=ENC.max_pixels, image_mean=half,
                                          image_std=half)

    class Videos(Qwen3VLVideoProcessor):
        """transformers' Qwen3-VL video processor (its sampling, resize rule, patchify and
        metadata) with the torchvision steps (not installed) done as the PIL image
        processor does them: a bicubic resize of each frame, rescale, normalise."""

        def __call__(self, videos, video_metadata=None, **kwargs):
            rows, grids = [], []
            for frames, meta in zip(videos, video_metadata):
                idx = self.sample_frames(meta)
                meta.frames_indices = idx
                picked = [frames[i] for i in idx]
                h, w = hf_smart_resize(len(picked), picked[0].height, picked[0].width,
                                       temporal_factor=2, factor=32,
                                       min_pixels=self.size["shortest_edge"],
                                       max_pixels=self.size["longest_edge"])
                x = np.stack([_unpatchify_image_rows(
                    image_proc(images=[f.convert("RGB").resize((w, h), Image.BICUBIC)],
                               do_resize=False, return_tensors="np")["pixel_values"],
                    h // 16, w // 16, 16) for f in picked])
                r, t, gh, gw = self.patchify(torch.from_numpy(np.ascontiguousarray(x))[None],
                                             16, 2, 2)
                rows.append(r[0])
                grids.append([t, gh, gw])
            return {"pixel_values_videos": torch.cat(rows),
                    "video_grid_thw": torch.tensor(grids), "video_metadata": video_metadata}

    videos = Videos(patch_size=16, cap_pixels_per_frame=False,
                    size={"shortest_edge": ENC.video_min_pixels,
                          "longest_edge": ENC.video_max_pixels})
    folder = tmp_path / "tok"
    hf_tok = _word_tokenizer(folder)
    monkeypatch.setattr(Qwen3VLProcessor, "check_argument_for_proper_class",
                        lambda self, name, arg: type(arg))
    hf = Qwen3VLProcessor(image_processor=image_proc, tokenizer=hf_tok,
                          video_processor=videos)
    tok = HuggingFaceTokenizer(folder, image_token_id=hf_tok.convert_tokens_to_ids(
        "<|image_pad|>"), item_tags=tag_request("auto", [FAMILIES["qwen3_vl"]]))
    image, video = qwen3_vl_processor(SimpleNamespace(image_processor_config=None), ENC)
    return hf, tok, {"image": image, "video": video}


def test_record_equals_processor_and_rope_index(tmp_path, qwen3):
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
    from transformers.video_utils import VideoMetadata

    hf, tok, procs = qwen3
    images = [_png(tmp_path / "a.png", 90, 60, 4), _png(tmp_path / "b.png", 40, 70, 5)]
    # 7 frames at 4 fps: 4 sampled (0 2 4 6), two temporal patches, each after its time
    frames = [_png(tmp_path / f"f{i}.png", 80, 100, 6 + i) for i in range(7)]
    (record,) = _records(tmp_path, [{
        "id": "q", "images": images, "videos": [{"frames": frames, "fps": 4}],
        "conversations": [{"from": "human", "value": "<image> compare <video> and <image>"},
                          {"from": "gpt", "value": "7"}]}])
    counts = {m: p.token_count for m, p in procs.items()}
    sample = encode_record(record, tok, counts, None, processors=procs)
    text = "<|endoftext|>USER: " + record.turns[0].text + " ASSISTANT: 7<|endoftext|>"
    text = text.replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>").replace(
        "<video>", "<|vision_start|><|video_pad|><|vision_end|>")
    ref = hf(images=[Image.open(p) for p in images], videos=[[Image.open(f) for f in frames]],
             video_metadata=[VideoMetadata(total_num_frames=7, fps=4)], text=text,
             return_tensors="pt")
    ids = sample.tokens.tolist()
    assert ids == ref["input_ids"][0].tolist()
    assert hf.tokenizer.decode(ids).count("seconds") == 2  # "<0.2 seconds>", "<1.2 ...>"
    for key in ("image_grid_thw", "video_grid_thw"):
        assert sample.media[key].tolist() == ref[key].tolist()
    assert np.array_equal(sample.media["image"].numpy(), ref["pixel_values"].numpy())
    assert np.array_equal(sample.media["video"].numpy(), ref["pixel_values_videos"].numpy())
    kinds = token_kinds(ref["input_ids"].numpy(), tok.media_token_id("image"),
                        tok.media_token_id("video"))
    assert (torch.from_numpy(kinds) == ref["mm_token_type_ids"]).all()  # tags, times: text
    tag = tok.item_tag("video")
    assert sample.loss_mask[sample.labels == tag.start_id].sum() == 0  # tags are input

    vocab = hf.tokenizer
    cfg = Qwen3VLConfig(
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=16,
                         vocab_size=32, rope_parameters={"rope_type": "default",
                                                         "rope_theta": 1e4,
                                                         "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                           out_hidden_size=16, num_position_embeddings=16,
                           deepstack_visual_indexes=[0]),
        image_token_id=vocab.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=vocab.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tag.start_id, vision_end_token_id=tag.end_id)
    pos, _ = Qwen3VLModel(cfg).eval().get_rope_index(
        ref["input_ids"], ref["mm_token_type_ids"], image_grid_thw=ref["image_grid_thw"],
        video_grid_thw=ref["video_grid_thw"])
    assert sample.position_ids.tolist() == pos[:, 0].tolist()


def test_bad_items_name_the_record(tmp_path, qwen3):
    _, tok, procs = qwen3
    counts = {m: p.token_count for m, p in procs.items()}
    small = _png(tmp_path / "small.png", 20, 50, 1)
    (rec,) = _records(tmp_path, [{"id": "tiny", "text": "<image>", "images": [small]}])
    with pytest.raises(DataRecordError, match=r"'tiny'.*small.png of size 50x20 .* below the "
                                              r"minimum size: each side must be at least 32"):
        encode_record(rec, tok, counts, None, processors=procs)
    one = [_png(tmp_path / "f.png", 64, 64, 2)]
    (rec,) = _records(tmp_path, [{"id": "still", "text": "<video>",
                                  "videos": [{"frames": one, "fps": 2}]}])
    with pytest.raises(DataRecordError, match=r"'still'.*video \(video of 1 frames at 2\.0 "
                                              r"fps\): 1 frame\(s\).*do not fill the "
                                              r"temporal patch of 2 frames"):
        encode_record(rec, tok, counts, None, processors=procs)
    frames = [_png(tmp_path / f"g{i}.png", 64, 64, 3 + i) for i in range(4)]
    (rec,) = _records(tmp_path, [{"id": "long", "text": "<video> 7",
                                  "videos": [{"frames": frames, "fps": 2}]}])
    n = len(encode_record(rec, tok, counts, None, processors=procs).tokens)  # with times
    with pytest.raises(DataRecordError, match=f"'long'.*{n} tokens exceed "
                                              f"max_seq_length={n - 1}"):
        encode_record(rec, tok, counts, None, max_seq_length=n - 1, processors=procs)


def test_video_sampling_comes_from_the_processor_config(tmp_path):
    """A converted checkpoint samples frames as its video_preprocessor_config.json says;
    a field the data path does not follow is refused, naming it."""
    import json

    from transformers import Qwen3VLConfig

    from megatron_mm.families.qwen3_vl.hf import processor_flags
    from megatron_mm.hf.errors import ConversionError

    config, path = Qwen3VLConfig(), tmp_path / "video_preprocessor_config.json"
    fields = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "fps": 1.5,
              "min_frames": 2, "max_frames": 64, "do_sample_frames": True,
              "size": {"shortest_edge": 4096, "longest_edge": 25165824}}
    path.write_text(json.dumps(fields))
    assert processor_flags(str(tmp_path), config) == {
        "video_min_pixels": 4096, "video_max_pixels": 25165824, "video_fps": 1.5,
        "video_min_frames": 2, "video_max_frames": 64}
    for key, value in (("do_sample_frames", False), ("cap_pixels_per_frame", True)):
        path.write_text(json.dumps({**fields, key: value}))
        with pytest.raises(ConversionError, match=f"video_preprocessor_config.json: {key}="
                                                  f"{value} is not supported"):
            processor_flags(str(tmp_path), config)

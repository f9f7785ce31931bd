"""Item tags around each media item's placeholder tokens (--image-tag-type): a record's tokens
equal the Hugging Face processor's ``input_ids`` (InternVLProcessor: ``<img>`` ... ``</img>``;
Qwen2_5_VLProcessor on the chat template's ``<|vision_start|><|image_pad|><|vision_end|>``,
images and a video), with tokenizers built offline; the tags carry no loss, count as text
in M-RoPE (equal to ``get_rope_index``), and in every length check; records that already
carry them, and tags the tokenizer lacks, are clear errors."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_mm.config import ConfigError
from megatron_mm.data.hf_tokenizer import HuggingFaceTokenizer
from megatron_mm.data.item_tags import IMAGE_TAGS, MissingTagToken, tag_request
from megatron_mm.data.processing import encode_record, tokenize_record
from megatron_mm.data.records import DataRecordError
from megatron_mm.data.tokenizer import build_tokenizer
from megatron_mm.families.registry import FAMILIES
from media_files import write_image as _png, write_records as _records

INTERNVL, QWEN = FAMILIES["internvit"], FAMILIES["qwen2_5_vl"]
WORDS = ["USER", "ASSISTANT", ":", "describe", "this", "and", "compare", "7", "frames"]


def _word_tokenizer(folder, specials, **named):
    """A word-level fast tokenizer (saved to ``folder``) with ``specials`` as added tokens;
    ``named``: transformers' special-token attributes (bos_token=..., image_token=...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(list(specials))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", **named)
    tok.save_pretrained(folder)
    return tok


def _hf_text(record, items, bos, eos):
    """The record in our template (processing.py), each placeholder in the processor's
    text form (``items``: placeholder -> text), as the processor is given it."""
    text = bos
    for human, gpt in zip(record.turns[0::2], record.turns[1::2]):
        text += f"USER: {human.text} ASSISTANT: {gpt.text}{eos}"
    for placeholder, form in items.items():
        text = text.replace(placeholder, form)
    return text


def _check_tags_are_input(sample, tag):
    """No position predicts a tag, and the answer is still learned."""
    labels, mask = sample.labels, sample.loss_mask
    is_tag = (labels == tag.start_id) | (labels == tag.end_id)
    assert is_tag.sum() > 0 and not mask[is_tag].any()
    assert mask.sum() > 0


# -- InternVL --------------------------------------------------------------------------------
@pytest.fixture
def internvl(tmp_path, monkeypatch):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import \
        GotOcr2ImageProcessorPil
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    from megatron_mm.families.internvl.media import InternVLImageProcessor, InternVLProcessorConfig
    from megatron_mm.families.internvl.tiles import IMAGENET_MEAN, IMAGENET_STD, InternVLTiling

    # 4 tokens per tile (tile 448, patch 112, no pixel shuffle) keep the ids short
    tiling = InternVLTiling(max_tiles=6, patch_size=112, downsample_ratio=1.0)
    folder = tmp_path / "tok"
    hf_tok = _word_tokenizer(folder, ["<s>", "</s>", "<img>", "</img>", "<IMG_CONTEXT>"],
                             bos_token="<s>", eos_token="</s>", extra_special_tokens={
                                 "start_image_token": "<img>", "end_image_token": "</img>",
                                 "context_image_token": "<IMG_CONTEXT>",
                                 "video_token": "<video>"})
    # the processor's tokenizer class check names a backend this project does not install
    monkeypatch.setattr(InternVLProcessor, "check_argument_for_proper_class",
                        lambda self, name, arg: type(arg))
    hf = InternVLProcessor(
        image_processor=GotOcr2ImageProcessorPil(size={"height": 448, "width": 448},
                                                 crop_to_patches=True, min_patches=1,
                                                 max_patches=6, image_mean=list(IMAGENET_MEAN),
                                                 image_std=list(IMAGENET_STD)),
        tokenizer=hf_tok, video_processor=None, image_seq_length=tiling.tokens_per_tile)
    ours = HuggingFaceTokenizer(folder, image_token_id=hf_tok.context_image_token_id,
                                item_tags=tag_request("auto", [INTERNVL]))
    proc = InternVLImageProcessor(InternVLProcessorConfig(tiling))
    return hf, ours, proc


def test_internvl_record_equals_internvl_processor(tmp_path, internvl):
    hf, tok, proc = internvl
    images = [_png(tmp_path / "a.png", 900, 300, 0), _png(tmp_path / "b.png", 60, 50, 1)]
    (record,) = _records(tmp_path, [{"id": "r", "images": images, "conversations": [
        {"from": "human", "value": "<image>\ndescribe this and <image> compare"},
        {"from": "gpt", "value": "7"}]}])
    sample = encode_record(record, tok, {"image": proc.token_count}, None,
                           processors={"image": proc})
    ref = hf(images=[Image.open(p) for p in images], return_tensors="np",
             text=_hf_text(record, {"<image>": "<IMG_CONTEXT>"}, "<s>", "</s>"))
    assert sample.tokens.tolist() == ref["input_ids"][0].tolist()
    assert np.array_equal(sample.media["image"].numpy(), ref["pixel_values"])
    tag = tok.item_tag("image")
    assert (tag.start, tag.end) == IMAGE_TAGS["internvl"]
    assert sample.tokens.tolist().count(tag.start_id) == 2
    _check_tags_are_input(sample, tag)
    # the length checks count them: one token less than the sample is refused
    n = len(tokenize_record(record, tok, {"image": proc.token_count}).ids)
    assert n == len(sample.tokens)
    with pytest.raises(DataRecordError, match=f"'r'.*{n} tokens exceed max_seq_length"):
        encode_record(record, tok, {"image": proc.token_count}, None, n - 1,
                      processors={"image": proc})


def test_caption_prompt_ends_after_the_end_tag(tmp_path, internvl):
    _, tok, proc = internvl
    image = _png(tmp_path / "a.png", 60, 50, 2)
    (record,) = _records(tmp_path, [{"id": "c", "text": "<image> describe this",
                                     "images": [image]}])
    sample = encode_record(record, tok, {"image": proc.token_count}, None,
                           processors={"image": proc})
    tag, ids = tok.item_tag("image"), sample.tokens.tolist()
    assert ids[sample.prompt_len - 1] == tag.end_id  # decoding starts after </img>
    _check_tags_are_input(sample, tag)
    assert sample.loss_mask[sample.prompt_len - 1] == 1  # "describe" is learned


def test_records_that_carry_the_tags_are_refused_or_kept(tmp_path, internvl):
    _, tok, proc = internvl
    image = _png(tmp_path / "a.png", 60, 50, 3)
    counts = {"image": proc.token_count}
    for text in ("<img><image></img> describe", "<img>\n<image> describe",
                 "describe <image> </img>"):
        (record,) = _records(tmp_path, [{"id": "tagged", "text": text, "images": [image]}])
        with pytest.raises(DataRecordError, match=r"'tagged'.*already wraps <image> in <img> "
                                                  r"\.\.\. </img>.*--image-tag-type none"):
            tokenize_record(record, tok, counts)
    # --image-tag-type none: the record's own tags (tokenized as the tokens they are) stay
    plain = HuggingFaceTokenizer(tok.path, image_token_id=tok.media_token_id("image"),
                                 item_tags=tag_request("none", [INTERNVL]))
    (record,) = _records(tmp_path, [{"id": "tagged", "text": "<img><image></img> describe",
                                     "images": [image]}])
    (untagged,) = _records(tmp_path, [{"id": "u", "text": "<image> describe",
                                       "images": [image]}])
    assert (tokenize_record(record, plain, counts).ids ==
            tokenize_record(untagged, tok, counts).ids)


# -- Qwen2.5-VL ------------------------------------------------------------------------------
class _Videos:
    """A stand-in for Qwen2VLVideoProcessor (its torchvision backend is not installed): our
    patches and grids (equal to transformers' patch order in test_qwen_vl_media); the text
    expansion and second_per_grid_ts around them are Qwen2_5_VLProcessor's own."""

    def __init__(self, cfg, fps):
        self.cfg, self.fps = cfg, fps
        self.merge_size = cfg.geometry.merge_size
        self.temporal_patch_size = cfg.geometry.temporal_patch_size

    def __call__(self, videos, **kwargs):
        from megatron_mm.families.qwen2_5_vl.media import process_media

        out = process_media(videos=[(list(v), self.fps) for v in videos], cfg=self.cfg)
        return {"pixel_values_videos": out.pixel_values_videos,
                "video_grid_thw": out.video_grid_thw,
                "video_metadata": [SimpleNamespace(sampled_fps=self.fps) for _ in videos]}


@pytest.fixture
def qwen(tmp_path, monkeypatch):
    from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        Qwen2VLImageProcessorPil

    from megatron_mm.families.qwen2_5_vl.media_processor import qwen_vl_processor
    from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig

    enc = Qwen2_5VLVisionConfig(hidden_size=32, num_layers=2, num_attention_heads=4,
                                fullatt_block_indexes=(1,), out_hidden_size=64,
                                min_pixels=28 * 28, max_pixels=112 * 112,
                                video_min_pixels=28 * 28, video_max_pixels=56 * 56,
                                tokens_per_second=2.0)
    image, video = qwen_vl_processor(SimpleNamespace(image_processor_config=None), enc)
    folder = tmp_path / "tok"
    specials = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
    hf_tok = _word_tokenizer(folder, specials, eos_token="<|endoftext|>")
    monkeypatch.setattr(Qwen2_5_VLProcessor, "check_argument_for_proper_class",
                        lambda self, name, arg: type(arg))
    hf = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112),
        tokenizer=hf_tok, video_processor=_Videos(video.cfg, 4.0))
    ours = HuggingFaceTokenizer(folder, image_token_id=hf_tok.convert_tokens_to_ids(
        "<|image_pad|>"), item_tags=tag_request("auto", [QWEN]))  # as a converted checkpoint
    return hf, ours, {"image": image, "video": video}, enc


def test_qwen_record_equals_processor_and_rope_index(tmp_path, qwen):
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    from megatron_mm.families.qwen2_5_vl.mrope_positions import token_kinds

    hf, tok, procs, enc = qwen
    images = [_png(tmp_path / "a.png", 90, 60, 4), _png(tmp_path / "b.png", 40, 70, 5)]
    frames = [_png(tmp_path / f"f{i}.png", 64, 48, 6 + i) for i in range(4)]
    (record,) = _records(tmp_path, [{
        "id": "q", "images": images, "videos": [{"frames": frames, "fps": 4}],
        "conversations": [{"from": "human", "value": "<image> compare <video> and <image>"},
                          {"from": "gpt", "value": "7"}]}])
    counts = {m: p.token_count for m, p in procs.items()}
    sample = encode_record(record, tok, counts, None, processors=procs)
    # the chat template's form of each item; the sample starts with EOS (no BOS in Qwen)
    items = {"<image>": "<|vision_start|><|image_pad|><|vision_end|>",
             "<video>": "<|vision_start|><|video_pad|><|vision_end|>"}
    ref = hf(images=[Image.open(p) for p in images], videos=[[Image.open(f) for f in frames]],
             text=_hf_text(record, items, "<|endoftext|>", "<|endoftext|>"),
             return_tensors="pt")
    ids = sample.tokens.tolist()
    assert ids == ref["input_ids"][0].tolist()
    for key in ("image_grid_thw", "video_grid_thw"):
        assert sample.media[key].tolist() == ref[key].tolist()
    assert sample.media["second_per_grid_ts"].tolist() == list(ref["second_per_grid_ts"])
    start = tok.item_tag("image")
    assert tok.item_tag("video") == start and ids.count(start.start_id) == 3
    _check_tags_are_input(sample, start)

    vocab = hf.tokenizer
    cfg = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=16, vocab_size=32,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                          "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                           out_hidden_size=16, window_size=56, fullatt_block_indexes=[0],
                           tokens_per_second=int(enc.tokens_per_second)),
        image_token_id=vocab.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=vocab.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=start.start_id, vision_end_token_id=start.end_id)
    model = Qwen2_5_VLModel(cfg).eval()
    kinds = token_kinds(ref["input_ids"].numpy(), cfg.image_token_id, cfg.video_token_id)
    assert (torch.from_numpy(kinds) == ref["mm_token_type_ids"]).all()  # tags are text (0)
    pos, _ = model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"],
                                  image_grid_thw=ref["image_grid_thw"],
                                  video_grid_thw=ref["video_grid_thw"],
                                  second_per_grid_ts=ref["second_per_grid_ts"])
    assert sample.position_ids.tolist() == pos[:, 0].tolist()


# -- tokenizers and the flag -------------------------------------------------------------------
def test_sentencepiece_auto_leaves_tags_out_and_a_named_style_adds_them():
    plain = build_tokenizer()
    auto = build_tokenizer(item_tags=tag_request("auto", [INTERNVL]))
    assert auto.item_tag("image") is None and auto.missing_tags == ["<img>", "</img>"]
    assert auto.vocab_size == plain.vocab_size  # demos and their checkpoints unchanged
    named = build_tokenizer(item_tags=tag_request("internvl", [INTERNVL]))
    tag = named.item_tag("image")
    base = plain.vocab_size  # after the media tokens
    assert (tag.start_id, tag.end_id, named.vocab_size) == (base, base + 1, base + 2)
    assert named.detokenize([tag.start_id] + named.tokenize("hi") + [tag.end_id]) == "hi"
    import pickle  # DataLoader workers get the same tags
    assert pickle.loads(pickle.dumps(named)).item_tag("image") == tag
    # a named style covers every item of the vision family (Qwen: videos too)
    qwen = tag_request("nvlm", [QWEN, FAMILIES["whisper"]])
    assert dict(qwen.tokens) == {"image": ("<Image>", "</Image>"),
                                 "video": ("<Image>", "</Image>")}
    assert not tag_request("", [QWEN]).tokens and not tag_request("none", [QWEN]).tokens


def test_converted_sentencepiece_checkpoint_finds_its_added_tokens(tmp_path):
    """An InternLM2-style checkpoint: <img> lives in tokenizer_config.json beside
    tokenizer.model, not in the SentencePiece model; auto finds it there."""
    import shutil

    from megatron_mm.data.tokenizer import default_tokenizer_model

    shutil.copy(default_tokenizer_model(), tmp_path / "tokenizer.model")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        "32010": {"content": "<img>"}, "32011": {"content": "</img>"},
        "32012": {"content": "<IMG_CONTEXT>"}}}))
    tok = build_tokenizer("SentencePiece", str(tmp_path / "tokenizer.model"),
                          image_token_id=32012, item_tags=tag_request("auto", [INTERNVL]))
    tag = tok.item_tag("image")
    assert (tag.start_id, tag.end_id) == (32010, 32011) and tok.vocab_size == 32013


def test_a_named_style_the_tokenizer_lacks_is_an_error(tmp_path, internvl):
    _, tok, _ = internvl
    with pytest.raises(MissingTagToken, match=r"--image-tag-type qwen-vl: the tokenizer has "
                                              r"no token '<\|vision_start\|>'"):
        HuggingFaceTokenizer(tok.path, image_token_id=tok.media_token_id("image"),
                             item_tags=tag_request("qwen-vl", [INTERNVL]))


def test_the_flag_names_the_token_in_a_training_run(tmp_path, internvl):
    from megatron_mm.training.cli.arguments import parse_run_config
    from megatron_mm.training.loop.trainer import tokenizer_from_config

    _, tok, _ = internvl
    flags = ["--vision-model-type", "internvit", "--tokenizer-type", "HuggingFaceTokenizer",
             "--tokenizer-model", tok.path, "--image-token-id",
             str(tok.media_token_id("image")), "--img-h", "448", "--img-w", "448",
             "--patch-dim", "14", "--seq-length", "4096"]
    assert tokenizer_from_config(parse_run_config(flags, world_size=1)).item_tag(
        "image") is not None
    config = parse_run_config(flags + ["--image-tag-type", "nvlm"], world_size=1)
    with pytest.raises(ConfigError, match="--image-tag-type nvlm: the tokenizer has no token "
                                          "'<Image>'.*--tokenizer-model"):
        tokenizer_from_config(config)

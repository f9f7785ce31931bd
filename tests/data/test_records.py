"""Record validation, error messages and image loading/preprocessing."""
import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_mm.data.media import (CLIP_MEAN, CLIP_STD, ImageProcessorConfig, load_image,
                                    preprocess_image)
from megatron_mm.data.records import MODALITIES, DataRecordError, parse_record, read_records


def png(value: int = 128, size=(8, 8), mode="L") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, value).save(buf, format="PNG")
    return buf.getvalue()


def data_uri(b: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(b).decode()


def write_jsonl(path, records) -> str:
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def conv(rid, question="<image>\nWhat digit is this?", answer="seven", images=None):
    rec = {"id": rid, "conversations": [{"from": "human", "value": question},
                                        {"from": "gpt", "value": answer}]}
    if images is not None:
        rec["images"] = images
    return rec


def test_modality_table_has_image():
    spec = MODALITIES["image"]
    assert (spec.placeholder, spec.record_key) == ("<image>", "images")


def test_reads_conversation_text_and_resolves_paths(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(png())
    path = write_jsonl(tmp_path / "d.jsonl", [
        conv("c1", images=["imgs/a.png"]),
        "",  # blank lines are skipped
        {"id": 7, "text": "<image> a seven <image>",
         "images": [{"data": data_uri(png())}, data_uri(png())]},
        {"conversations": [{"from": "USER", "value": "hi"}, {"from": "assistant", "value": "yo"}]},
    ])
    recs = read_records(path)
    assert [r.id for r in recs] == ["c1", "7", "d.jsonl:4"]
    assert recs[0].is_conversation and [t.role for t in recs[0].turns] == ["human", "assistant"]
    assert recs[0].media["image"][0].path == str(tmp_path / "imgs" / "a.png")
    assert recs[1].text == "<image> a seven <image>" and len(recs[1].media["image"]) == 2
    assert all(m.data is not None for m in recs[1].media["image"])
    assert recs[2].media["image"] == []
    assert [t.role for t in recs[2].turns] == ["human", "assistant"]


def test_placeholder_mismatch_names_record_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        conv("ok", question="no image here", images=[]),
        conv("x", question="<image> and <image>?", images=[{"data": data_uri(png())}]),
    ])
    with pytest.raises(DataRecordError) as e:
        read_records(path)
    assert str(e.value) == "record 'x' (bad.jsonl line 2) has 2 <image> placeholders but 1 images"


def test_placeholder_count_too_few_and_missing_key(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl",
                       [conv("y", question="no placeholder", images=[data_uri(png())])])
    with pytest.raises(DataRecordError,
                       match=r"record 'y' \(a.jsonl line 1\) has 0 <image> placeholders "
                             r"but 1 images"):
        read_records(path)
    path = write_jsonl(tmp_path / "b.jsonl", [conv("z")])  # placeholder, no "images" key
    with pytest.raises(DataRecordError,
                       match=r"'z' \(b.jsonl line 1\) has 1 <image> placeholders but 0 images"):
        read_records(path)


def test_missing_image_file_names_path_and_record(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [conv("rec-9", images=["nope/missing.png"])])
    with pytest.raises(DataRecordError) as e:
        read_records(path)
    msg = str(e.value)
    assert "rec-9" in msg and "m.jsonl line 1" in msg
    assert str(tmp_path / "nope" / "missing.png") in msg
    assert len(read_records(path, check_files=False)) == 1  # the check is the up-front one


def test_invalid_json_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "j.jsonl", [conv("a", question="q"), '{"id": "b", "text": "x"'])
    with pytest.raises(DataRecordError, match=r"^j.jsonl line 2: invalid JSON"):
        read_records(path)


@pytest.mark.parametrize("obj, fragment", [
    ({"id": "r"}, "exactly one of 'conversations' or 'text'"),
    ({"id": "r", "text": "a", "conversations": []}, "exactly one of"),
    ({"id": "r", "text": 3}, "'text' must be a string"),
    ({"id": "r", "conversations": []}, "non-empty list"),
    ({"id": "r", "conversations": [{"from": "human"}]}, "'from' and 'value'"),
    ({"id": "r", "conversations": [{"from": "bot", "value": "a"}]}, "unknown role 'bot'"),
    ({"id": "r", "conversations": [{"from": "gpt", "value": "a"}]}, "should be a human turn"),
    ({"id": "r", "conversations": [{"from": "human", "value": "a"}]},
     "last turn must be an assistant"),
    ({"id": "r", "conversations": [{"from": "human", "value": "a"},
                                   {"from": "human", "value": "b"}]},
     "should be an assistant turn"),
    ({"id": "r", "conversations": [{"from": "human", "value": "a"},
                                   {"from": "gpt", "value": "<image>"}],
      "images": ["x.png"]}, "only allowed in human turns"),
    ({"id": "r", "text": "<image>", "images": "x.png"}, "'images' must be a list"),
    ({"id": "r", "text": "<image>", "images": [{"path": "x.png"}]}, "without a non-empty 'data'"),
    ({"id": "r", "text": "<image>", "images": [5]}, "must be a path string"),
    ({"id": ["r"], "text": "a"}, "missing or invalid 'id'"),
    ({"text": "a"}, "missing or invalid 'id'"),
])
def test_missing_or_bad_fields(obj, fragment):
    with pytest.raises(DataRecordError) as e:
        parse_record(obj, source="f.jsonl line 4", check_files=False)
    assert fragment in str(e.value)
    assert "f.jsonl line 4" in str(e.value)


def test_duplicate_ids_rejected(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [conv("a", question="q"), conv("a", question="q")])
    with pytest.raises(DataRecordError,
                       match=r"'a' \(d.jsonl line 2\): duplicate id "
                             r"\(first seen at d.jsonl line 1\)"):
        read_records(path)


def test_load_image_forms_agree(tmp_path):
    raw = png(200)
    (tmp_path / "g.png").write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    imgs = [load_image("g.png", base_dir=str(tmp_path)), load_image({"data": data_uri(raw)}),
            load_image({"data": b64}), load_image(data_uri(raw))]
    for im in imgs:
        assert im.mode == "RGB" and im.size == (8, 8)
        assert np.array_equal(np.asarray(im), np.full((8, 8, 3), 200, dtype=np.uint8))


def test_undecodable_image_is_lazy_and_named(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    path = write_jsonl(tmp_path / "u.jsonl",
                       [conv("u1", images=["broken.png"]),
                        conv("u2", images=[{"data": "data:image/png;base64,@@@"}])])
    recs = read_records(path)  # reading succeeds: decoding is lazy
    with pytest.raises(DataRecordError, match=r"u1.*cannot decode image .*broken.png"):
        load_image(recs[0].media["image"][0], context=recs[0].where())
    with pytest.raises(DataRecordError,
                       match=r"record 'u2' \(u.jsonl line 2\): cannot decode image <inline data>"):
        load_image(recs[1].media["image"][0], context=recs[1].where())


def test_preprocess_resizes_and_normalises():
    cfg = ImageProcessorConfig(image_size=14)
    x = preprocess_image(Image.new("RGB", (8, 8), (255, 0, 255)), cfg)
    assert x.dtype == torch.float32 and x.shape == (3, 14, 14)
    expected = [(v - m) / s for v, m, s in zip((1, 0, 1), CLIP_MEAN, CLIP_STD)]
    for c in range(3):
        assert torch.allclose(x[c], torch.full((14, 14), expected[c]), atol=1e-5)
    # custom mean/std and a non-constant image: bicubic resize, /255, (x-m)/s
    cfg = ImageProcessorConfig(image_size=4, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    img = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).convert("RGB")
    ref = np.asarray(img.resize((4, 4), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    assert torch.allclose(preprocess_image(img, cfg), torch.from_numpy(ref.transpose(2, 0, 1)),
                          atol=1e-6)

"""Tokenizer, record encoding (placeholders, loss mask, labels), collation, dataset, sampler."""
import base64
import importlib.util
import io
import json
from collections import Counter

import pytest
import sentencepiece as spm
import torch
from PIL import Image

from megatron_mm.data.dataset import MegatronPretrainingSampler, MultimodalDataset
from megatron_mm.data.media import ImageProcessorConfig
from megatron_mm.data.processing import collate, encode_record
from megatron_mm.data.records import DataRecordError, parse_record
from megatron_mm.data.tokenizer import MISTRAL_COMMON_PIP, MultimodalTokenizer, build_tokenizer

CFG = ImageProcessorConfig(image_size=14, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


@pytest.fixture(scope="module")
def tok() -> MultimodalTokenizer:
    return build_tokenizer()  # the real Mistral v1 SentencePiece model


def uri(value: int) -> str:
    buf = io.BytesIO()
    Image.new("L", (8, 8), value).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def conv_record(turns, images=(), rid="r1"):
    conversations = []
    for h, g in turns:
        conversations += [{"from": "human", "value": h}, {"from": "gpt", "value": g}]
    return parse_record({"id": rid, "conversations": conversations, "images": list(images)},
                        source="t.jsonl line 1")


def loss_targets(sample) -> list[int]:
    """Positions p whose token is predicted with loss (loss_mask[p-1] == 1)."""
    return [t + 1 for t in torch.nonzero(sample.loss_mask).flatten().tolist()]


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_ids_and_vocab(tok):
    assert tok.base_vocab_size == 32000 and tok.vocab_size == 32003
    assert tok.media_token_id("image") == 32000
    assert tok.media_token_id("audio") == 32001
    assert tok.media_token_id("video") == 32002
    assert (tok.bos_id, tok.eos_id, tok.eod, tok.pad_id) == (1, 2, 2, 2)  # no pad in v1: pad = eos
    with pytest.raises(KeyError):
        tok.media_token_id("smell")


def test_tokenizer_matches_sentencepiece_and_round_trips(tok):
    # A leading space is tokenized literally, i.e. like SentencePiece's dummy prefix.
    assert tok.tokenize(" Hello, world!") == [22557, 28725, 1526, 28808]
    assert tok.tokenize("Hello") != tok.tokenize(" Hello")  # no dummy prefix inserted
    for s in ["Hello, world!", " seven", "  two  spaces ", "\nWhat digit is this?", "héllo 🙂 世界",
              "", " "]:
        ids = tok.tokenize(s)
        assert tok.bos_id not in ids and tok.eos_id not in ids
        assert tok.detokenize(ids) == s
    a, b = "USER: ", "\nWhat digit? ASSISTANT:"
    assert tok.detokenize(tok.tokenize(a) + tok.tokenize(b)) == a + b
    # media, bos, eos are skipped when decoding
    ids = [tok.bos_id, 32000, 32000] + tok.tokenize(" six") + [tok.eos_id]
    assert tok.detokenize(ids) == " six"
    assert tok.tokenize("<image>") != [32000]  # placeholders are expanded by processing, not here


def test_missing_mistral_common_names_pip_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError) as e:
        build_tokenizer()
    assert MISTRAL_COMMON_PIP in str(e.value)
    assert MISTRAL_COMMON_PIP == "pip install --no-deps mistral-common==1.13.1"


def test_custom_sentencepiece_model_path(tmp_path):
    words = "zero one two three four five".split() * 20
    corpus = [f"the digit {w} number {i}" for i, w in enumerate(words)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus),
                                   model_prefix=str(tmp_path / "tiny"), vocab_size=300,
                                   model_type="bpe", byte_fallback=True, pad_id=3,
                                   normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, minloglevel=2)
    t = build_tokenizer("SentencePiece", str(tmp_path / "tiny.model"))
    assert (t.vocab_size, t.media_token_id("image"), t.pad_id) == (303, 300, 3)
    assert t.detokenize(t.tokenize(" the digit two")) == " the digit two"
    with pytest.raises(ValueError, match="tokenizer_model"):
        build_tokenizer("SentencePiece")
    with pytest.raises(ValueError, match="unknown tokenizer_type"):
        build_tokenizer("GPT2BPE")


# ---------------------------------------------------------------- encoding

@pytest.mark.parametrize("n", [1, 7])
def test_conversation_layout_expansion_and_loss(tok, n):
    rec = conv_record([("<image>\nWhat digit is this?", "seven")], images=[uri(10)])
    s = encode_record(rec, tok, {"image": n}, CFG)
    img = tok.media_token_id("image")
    prompt = ([tok.bos_id] + tok.tokenize("USER: ") + [img] * n
              + tok.tokenize("\nWhat digit is this? ASSISTANT:"))
    answer = tok.tokenize(" seven") + [tok.eos_id]
    assert s.tokens.tolist() == prompt + answer
    assert s.tokens.dtype == torch.long and s.loss_mask.dtype == torch.float32
    assert (s.tokens == img).sum().item() == n
    assert loss_targets(s) == list(range(len(prompt), len(prompt) + len(answer)))
    assert s.prompt_len == len(prompt) and s.answer == "seven" and s.record_id == "r1"
    assert s.media["image"].shape == (1, 3, 14, 14)


def test_labels_are_shifted_tokens(tok):
    s = encode_record(conv_record([("<image> hi", "there")], images=[uri(1)]), tok, {"image": 3},
                      CFG)
    assert s.labels.dtype == torch.long and s.labels.shape == s.tokens.shape
    assert s.labels[:-1].tolist() == s.tokens[1:].tolist()
    assert s.labels[-1].item() == tok.pad_id and s.loss_mask[-1].item() == 0


def test_multi_turn_multi_image(tok):
    rec = conv_record([("<image> first?", "one"), ("and <image> then <image>?", "two three")],
                      images=[uri(0), uri(100), uri(255)])
    n = 5
    s = encode_record(rec, tok, {"image": n}, CFG)
    img = tok.media_token_id("image")
    p1 = [tok.bos_id] + tok.tokenize("USER: ") + [img] * n + tok.tokenize(" first? ASSISTANT:")
    a1 = tok.tokenize(" one") + [tok.eos_id]
    p2 = (tok.tokenize("USER: and ") + [img] * n + tok.tokenize(" then ") + [img] * n
          + tok.tokenize("? ASSISTANT:"))
    a2 = tok.tokenize(" two three") + [tok.eos_id]
    assert s.tokens.tolist() == p1 + a1 + p2 + a2
    o1, o2 = len(p1), len(p1 + a1 + p2)
    assert loss_targets(s) == list(range(o1, o1 + len(a1))) + list(range(o2, o2 + len(a2)))
    assert s.prompt_len == o2 and s.answer == "two three"
    # media never carries loss, and images are in appearance order
    targets = set(loss_targets(s))
    assert not any(s.tokens[p].item() == img for p in targets)
    assert s.media["image"].shape == (3, 3, 14, 14)
    assert torch.allclose(s.media["image"][:, 0, 0, 0], torch.tensor([0.0, 100 / 255, 1.0]))


def test_text_record_loss_excludes_bos_and_media(tok):
    rec = parse_record({"id": "t", "text": "<image> a handwritten seven", "images": [uri(3)]})
    s = encode_record(rec, tok, {"image": 4}, CFG)
    img = tok.media_token_id("image")
    text = tok.tokenize(" a handwritten seven")
    assert s.tokens.tolist() == [tok.bos_id] + [img] * 4 + text + [tok.eos_id]
    assert loss_targets(s) == list(range(5, 5 + len(text) + 1))  # text tokens + eos
    assert s.prompt_len == 5 and s.answer == "a handwritten seven"
    plain = encode_record(parse_record({"id": "p", "text": "just text"}), tok, {"image": 4}, CFG)
    assert loss_targets(plain) == list(range(1, len(plain.tokens)))  # all but bos
    assert plain.media["image"].shape == (0, 3, 14, 14) and plain.prompt_len == 1


def test_max_seq_length_raises_without_truncation(tok):
    rec = conv_record([("<image> q", "a")], images=[uri(0)], rid="too-long")
    n = len(encode_record(rec, tok, {"image": 8}, CFG).tokens)
    assert len(encode_record(rec, tok, {"image": 8}, CFG, max_seq_length=n).tokens) == n
    with pytest.raises(DataRecordError, match=rf"record 'too-long' \(t.jsonl line 1\): {n} tokens "
                                              rf"exceed max_seq_length={n - 1}"):
        encode_record(rec, tok, {"image": 8}, CFG, max_seq_length=n - 1)


def test_missing_media_token_count(tok):
    rec = conv_record([("<image> q", "a")], images=[uri(0)])
    with pytest.raises(DataRecordError, match="media_token_counts"):
        encode_record(rec, tok, {}, CFG)


# ---------------------------------------------------------------- collation

def test_collate_padding_and_media_order(tok):
    recs = [conv_record([("<image> and <image>", "ab")], images=[uri(10), uri(20)], rid="a"),
            conv_record([("no image", "a longer answer with more words in it")], rid="b"),
            conv_record([("<image>", "c")], images=[uri(30)], rid="c")]
    samples = [encode_record(r, tok, {"image": 2}, CFG) for r in recs]
    lens = [len(s.tokens) for s in samples]
    b = collate(samples, pad_id=tok.pad_id, pad_to_multiple_of=8)
    S = -(-max(lens) // 8) * 8
    assert all(b[k].shape == (3, S) for k in ("tokens", "labels", "loss_mask", "position_ids"))
    for i, (s, n) in enumerate(zip(samples, lens)):
        assert torch.equal(b["tokens"][i, :n], s.tokens)
        assert torch.equal(b["labels"][i, :n], s.labels)
        assert torch.equal(b["loss_mask"][i, :n], s.loss_mask)
        assert (b["tokens"][i, n:] == tok.pad_id).all() and (b["labels"][i, n:] == tok.pad_id).all()
        assert (b["loss_mask"][i, n:] == 0).all()
    assert torch.equal(b["position_ids"], torch.arange(S).expand(3, S))
    # media: sample order, then appearance order
    assert torch.allclose(b["media"]["image"][:, 0, 0, 0], torch.tensor([10, 20, 30]) / 255)
    assert b["prompt_lens"] == [s.prompt_len for s in samples]
    assert b["answers"] == ["ab", "a longer answer with more words in it", "c"]
    assert b["record_ids"] == ["a", "b", "c"]
    # fixed length
    assert collate(samples, tok.pad_id, seq_length=64)["tokens"].shape == (3, 64)
    with pytest.raises(ValueError):
        collate(samples, tok.pad_id, seq_length=max(lens) - 1)


def test_collate_without_images(tok):
    s = encode_record(conv_record([("hi", "yo")]), tok, {"image": 2}, CFG)
    b = collate([s, s], tok.pad_id)
    assert b["media"]["image"].shape == (0, 3, 14, 14)
    assert b["tokens"].shape == (2, len(s.tokens))


def test_dataset_lazy_encoding(tok, tmp_path):
    lines = [{"id": f"r{i}", "conversations": [{"from": "human", "value": "<image> q"},
                                               {"from": "gpt", "value": "answer " * (1 + 10 * i)}],
              "images": [uri(i)]} for i in range(3)]
    lines[1]["images"] = [{"data": "data:image/png;base64,AAAA"}]  # valid base64, not an image
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    ds = MultimodalDataset(tmp_path / "d.jsonl", tok, {"image": 2}, CFG, max_seq_length=30)
    assert len(ds) == 3
    assert ds[0].record_id == "r0" and ds[0].media["image"].shape == (1, 3, 14, 14)
    with pytest.raises(DataRecordError,
                       match=r"record 'r1' \(d.jsonl line 2\): cannot decode image"):
        ds[1]
    with pytest.raises(DataRecordError, match=r"record 'r2' \(d.jsonl line 3\): \d+ tokens exceed"):
        ds[2]
    with pytest.raises(DataRecordError, match="'r2'"):
        ds.check_lengths()


# ---------------------------------------------------------------- sampler

def take(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


def steps(total, consumed, mbs, dp, n, seed=0, shuffle=True, gbs=None):
    """Per step: list over ranks of that rank's micro-batch."""
    per_rank = [take(MegatronPretrainingSampler(total, consumed, mbs, r, dp, shuffle, seed, gbs), n)
                for r in range(dp)]
    return [[per_rank[r][k] for r in range(dp)] for k in range(n)]


def test_sampler_exactly_once_per_epoch_across_ranks():
    total, mbs, dp = 23, 2, 3  # 23 // 6 = 3 steps per epoch, 5 samples dropped each epoch
    per_epoch = 3
    all_steps = steps(total, 0, mbs, dp, 3 * per_epoch)
    for e in range(3):
        flat = [i for st in all_steps[e * per_epoch:(e + 1) * per_epoch] for mb in st for i in mb]
        assert len(flat) == 18 and len(set(flat)) == 18 and all(0 <= i < total for i in flat)
        assert all(len(mb) == mbs for st in all_steps for mb in st)
    epochs = [sorted(i for st in all_steps[e * 3:(e + 1) * 3] for mb in st for i in mb)
              for e in range(3)]
    assert len({tuple(e) for e in epochs}) > 1  # the dropped tail varies by epoch


def test_sampler_rank_slices_of_global_order():
    s = MegatronPretrainingSampler(20, 0, 2, 1, 2, shuffle=True, seed=5)
    order = s.epoch_order(0).tolist()
    assert sorted(order) == list(range(20)) and order != list(range(20))
    assert take(s, 3) == [order[2:4], order[6:8], order[10:12]]
    unshuffled = MegatronPretrainingSampler(8, 0, 2, 0, 2, shuffle=False)
    assert take(unshuffled, 3) == [[0, 1], [4, 5], [0, 1]]


def test_sampler_deterministic_and_seeded():
    a = take(MegatronPretrainingSampler(100, 0, 4, 0, 1, True, seed=1), 60)
    assert a == take(MegatronPretrainingSampler(100, 0, 4, 0, 1, True, seed=1), 60)
    assert a != take(MegatronPretrainingSampler(100, 0, 4, 0, 1, True, seed=2), 60)
    assert a[:25] != a[25:50]  # epoch 1 is a fresh permutation


@pytest.mark.parametrize("consumed", [0, 8, 96, 104, 200, 1000])
def test_sampler_resume_is_identical_continuation(consumed):
    total, mbs, dp = 50, 2, 2  # epoch length 48 -> resumes cross epoch boundaries
    full = steps(total, 0, mbs, dp, 300)
    k = consumed // (mbs * dp)
    assert steps(total, consumed, mbs, dp, 20) == full[k:k + 20]


def test_sampler_rejects_misaligned_consumed():
    with pytest.raises(ValueError):
        MegatronPretrainingSampler(50, 3, 2, 0, 2)
    with pytest.raises(ValueError):
        MegatronPretrainingSampler(3, 0, 2, 0, 2)
    with pytest.raises(ValueError):
        MegatronPretrainingSampler(50, 0, 2, 2, 2)


def test_sampler_dp2_matches_dp1_same_global_batch():
    total = 37
    dp2 = steps(total, 0, mbs=2, dp=2, n=30, seed=3)
    dp1 = steps(total, 0, mbs=4, dp=1, n=30, seed=3)
    for s2, s1 in zip(dp2, dp1):
        assert sorted(s2[0] + s2[1]) == sorted(s1[0])
        assert s2[0] + s2[1] == s1[0]  # even the order within the global batch
    # with gradient accumulation: DP=1, mbs=2, 2 micro-batches per global batch of 4
    acc = steps(total, 0, mbs=2, dp=1, n=60, seed=3, gbs=4)
    assert [acc[2 * k][0] + acc[2 * k + 1][0] for k in range(30)] == [s[0] for s in dp1]
    assert Counter(len(mb) for st in acc for mb in st) == Counter({2: 60})


def test_collate_mrope_positions(tok):
    """Samples with 3-D positions collate to [3, B, L]: each row's own, padding counting on
    after its largest position; a sample without them counts 0, 1, ... on every axis."""
    recs = [conv_record([("q", "a")], rid="a"), conv_record([("a longer question", "b")])]
    samples = [encode_record(r, tok, {"image": 2}, CFG) for r in recs]
    n = len(samples[0].tokens)
    samples[0].position_ids = torch.stack([torch.arange(n), torch.arange(n) + 5,
                                           torch.arange(n) * 2])
    b = collate(samples, tok.pad_id, pad_to_multiple_of=8)
    length = b["tokens"].shape[1]
    assert b["position_ids"].shape == (3, 2, length)
    assert torch.equal(b["position_ids"][:, 0, :n], samples[0].position_ids)
    start = 2 * (n - 1) + 1
    assert torch.equal(b["position_ids"][:, 0, n:],
                       torch.arange(start, start + length - n).expand(3, -1))
    assert torch.equal(b["position_ids"][:, 1], torch.arange(length).expand(3, -1))
    samples[1].position_ids = torch.zeros(2, len(samples[1].tokens), dtype=torch.long)
    with pytest.raises(ValueError, match=r"expected \(3, "):
        collate(samples, tok.pad_id)

"""Weighted blends on the JSONL path (Megatron's ``--data-path 0.7 A 0.3 B``) and the data
flags' checks."""
import json
import os

import numpy as np
import pytest

from megatron_mm.data.blend import BlendedDataset
from megatron_mm.data.dataset import MegatronPretrainingSampler
from megatron_mm.data.sources import DataConfigError, parse_blend, resolve_sources


class _Items(list):
    """A stand-in member dataset: item i is (name, i)."""


def test_parse_blend():
    assert parse_blend(["A"]) == (["A"], None)
    assert parse_blend(["3", "A", "1", "B"]) == (["A", "B"], [0.75, 0.25])
    for bad, message in ((["0.7", "A", "0.3"], "weight-path pairs"),
                         (["A", "0.7", "B", "0.3"], "'A' is not a weight"),
                         (["-1", "A", "2", "B"], "non-negative")):
        with pytest.raises(DataConfigError, match=f"--data-path: .*{message}"):
            parse_blend(bad)


def test_blend_order_follows_the_weights_in_every_prefix():
    a, b = _Items(("a", i) for i in range(30)), _Items(("b", i) for i in range(500))
    blend = BlendedDataset([a, b], [0.7, 0.3], size=1000)
    names = [blend[i][0] for i in range(len(blend))]
    for n in (10, 100, 1000):  # Megatron-Core's rule: within one sample of the weights
        assert abs(names[:n].count("a") - 0.7 * n) <= 1
    # "a" (30 samples) is drawn 700 times: it starts over, each sample 23 or 24 times
    counts = np.bincount([blend[i][1] for i in range(len(blend)) if names[i] == "a"])
    assert counts.min() >= 23 and counts.max() <= 24


def test_shuffled_blend_batches_follow_the_weights():
    # What training sees: the sampler's shuffled order over the blend (seed fixed).
    a, b = _Items(("a", i) for i in range(200)), _Items(("b", i) for i in range(300))
    blend = BlendedDataset([a, b], [0.2, 0.8])
    sampler = MegatronPretrainingSampler(len(blend), 0, micro_batch_size=4,
                                         data_parallel_rank=0, data_parallel_size=1, seed=5)
    it = iter(sampler)
    drawn = [blend[i][0] for _ in range(50) for i in next(it)]  # 200 of 500
    share = drawn.count("a") / len(drawn)
    # hypergeometric: standard deviation 0.022 at p=0.2, n=200 of 500; 4 sigma
    assert abs(share - 0.2) < 0.09, share


def _jsonl(path):
    with open(path, "w") as f:
        f.write(json.dumps({"id": 1, "text": "x"}) + "\n")
    return str(path)


def test_data_flags_resolve_and_name_what_is_wrong(tmp_path):
    (tmp_path / "d").mkdir()
    train, valid = _jsonl(tmp_path / "d" / "train.jsonl"), _jsonl(tmp_path / "d" / "valid.jsonl")
    other = _jsonl(tmp_path / "other.jsonl")
    src = resolve_sources(["0.5", str(tmp_path / "d"), "0.5", other], valid)
    assert (src.kind, src.train, src.weights) == ("jsonl", [train, other], [0.5, 0.5])
    assert resolve_sources([str(tmp_path / "d")], None).valid == [valid]
    with pytest.raises(DataConfigError, match="--data-path: .*nope does not exist"):
        resolve_sources([str(tmp_path / "nope")], None)
    with pytest.raises(DataConfigError, match="pass --valid-data-path"):
        resolve_sources([other], None)
    os.makedirs(tmp_path / "e" / ".nv-meta")
    with pytest.raises(DataConfigError, match="mixes JSONL and Energon"):
        resolve_sources(["1", other, "1", str(tmp_path / "e")], valid)

"""No host syncs inside the model during a training step: the forward and backward of
every model chunk (encoder pieces too) read no device value on the host and size no
output by one (``tests/host_syncs.py`` lists what counts), in three settings: the default
model on one rank, the ViT in the LLM's bubbles (``--encoder-schedule bubble``, PP=2),
context parallelism (CP=2, bidirectional media attention; also with M-RoPE on 3-D
positions) and sequence parallelism (TP=2). What the model needs from the
batch's values comes from the ``BatchLayout`` the training step computes on the host;
the media go only to the chunks that embed them."""

import pytest
import torch
from dist_harness import run_distributed
from host_syncs import count_during, count_model_host_syncs
from test_mrope_training import MROPE, train_with_positions
from train_workers import TINY_MODEL, train

ONE_STEP = ["--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1"]


IMAGES, NONE = [["image"]], [[]]


@pytest.mark.parametrize("world, flags, scopes, media", [
    (1, [], 4, [IMAGES]),  # 2 micro-batches: 2 forwards, 2 backwards
    # the LLM chunks take no media: the ViT's pieces run as their own actions
    (2, ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"], 8,
     [NONE, NONE]),
    (2, ["--context-parallel-size", "2", "--media-attention", "bidirectional",
         "--context-parallel-block", "8"], 4, [IMAGES, IMAGES]),
    # sequence parallelism: the merge and the answer-only output layer on sequence shards
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"], 4, [IMAGES, IMAGES]),
    # M-RoPE: each CP rank rotates by its tokens' 3-D positions
    (2, MROPE + ["--context-parallel-size", "2", "--context-parallel-block", "8"], 4,
     [IMAGES, IMAGES]),
], ids=["default", "pp2-bubble", "cp2", "tp2-sp", "cp2-mrope"])
def test_no_host_syncs_inside_the_model(digits_dir, world, flags, scopes, media):
    worker = train_with_positions if "mrope" in flags else train
    ranks = run_distributed(worker, world, TINY_MODEL + ["--data-path", digits_dir]
                            + ONE_STEP + flags, (), count_model_host_syncs)
    for rank, out in enumerate(ranks):
        counted = out["observed"]["host_syncs"]
        assert counted["scopes"] == scopes, (rank, counted["scopes"])  # it did look
        assert counted["found"] == [], (rank, counted["found"])
    assert [out["observed"]["media_seen"] for out in ranks] == media


def test_the_counter_sees_each_kind_of_host_sync():
    x, mask = torch.arange(6.0), torch.arange(6) % 2 == 0
    index = torch.tensor([0, 2, 4])
    syncs = {
        "item": lambda: x.sum().item(), "int": lambda: int(x.max()),
        "tolist": lambda: x.tolist(), "cpu": lambda: x.cpu(), "bool": lambda: bool(x[1]),
        "mask index": lambda: x[mask], "mask assign": lambda: x.clone().index_put_(
            (mask,), torch.ones(3)),
        "nonzero": lambda: mask.nonzero(), "masked_select": lambda: x.masked_select(mask),
        "masked_scatter": lambda: x.masked_scatter(mask, x),
        "repeat_interleave": lambda: torch.repeat_interleave(index, index),
        "unique": lambda: torch.unique(index),
    }
    for what, fn in syncs.items():
        _, counter = count_during(fn)
        assert len(counter.found) >= 1, what
    free = {
        "index_select": lambda: x.index_select(0, index),
        "index_copy": lambda: x.index_copy(0, index, x[:3]),
        "long index": lambda: x[index],
        "fill through a mask": lambda: x.clone().__setitem__(mask, 0.0),  # masked_fill
        "sized repeat_interleave": lambda: torch.repeat_interleave(index, index,
                                                                   output_size=6),
        "int repeats": lambda: index.repeat_interleave(2),
    }
    for what, fn in free.items():
        _, counter = count_during(fn)
        assert counter.found == [], (what, counter.found)

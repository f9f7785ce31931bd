"""No host syncs in a training step's schedule: the forward and backward of every model
chunk (encoder pieces too) read no device value on the host and size no output by one,
and no action of the schedule (the forward step's batch, mask and layout, the loss, the
executor's token count) makes a blocking copy to the device (``tests/host_syncs.py``
lists what counts), in these settings: the default model on one rank (also with the
dense bidirectional media mask), the ViT in the LLM's bubbles (``--encoder-schedule
bubble``, PP=2: the first stage's token count is Megatron-Core's CPU scalar), context
parallelism (CP=2, bidirectional media attention; also with M-RoPE on 3-D positions)
and sequence parallelism (TP=2); and on one rank the Qwen2.5-VL tower (window attention,
native-resolution images and videos, M-RoPE) and an LLM in emulated FP8 (delayed scaling:
its amax reductions and scale updates stay on the device). What the model needs from the
batch's values comes from the ``BatchLayout`` the training step computes on the host; the
media go only to the chunks that embed them."""

import pytest
import torch
from dist_harness import run_distributed
from host_syncs import HostSyncCounter, count_during, count_step_host_syncs
from mrope_workers import MROPE, train_with_positions
from qwen_vl_data import QWEN_VL_MODEL, write_qwen_vl_data
from train_workers import TINY_MODEL, train

ONE_STEP = ["--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1"]


IMAGES, NONE = [["image"]], [[]]


@pytest.mark.processes
@pytest.mark.parametrize("world, flags, scopes, media", [
    (1, [], 4, [IMAGES]),  # 2 micro-batches: 2 forwards, 2 backwards
    # the [B, 1, S, S] mask of bidirectional media, made for every micro-batch
    (1, ["--media-attention", "bidirectional"], 4, [IMAGES]),
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
], ids=["default", "dense-mask", "pp2-bubble", "cp2", "tp2-sp", "cp2-mrope"])
def test_no_host_syncs_in_the_schedule(digits_dir, world, flags, scopes, media):
    worker = train_with_positions if "mrope" in flags else train
    ranks = run_distributed(worker, world, TINY_MODEL + ["--data-path", digits_dir]
                            + ONE_STEP + flags, (), count_step_host_syncs)
    for rank, out in enumerate(ranks):
        counted = out["observed"]["host_syncs"]
        assert counted["scopes"] == scopes, (rank, counted["scopes"])  # it did look
        assert counted["host_scopes"] >= scopes, (rank, counted["host_scopes"])
        assert counted["found"] == [], (rank, counted["found"])
        assert counted["compiles"] <= 1, (rank, counted["compiles"])  # not per micro-batch
    assert [out["observed"]["media_seen"] for out in ranks] == media


FP8_LLM = ["--fp8-format", "hybrid", "--fp8-emulation", "--fp8-modules", "llm",
           "--fp8-amax-history-len", "4"]


# Qwen3-VL's tower (frame attention, DeepStack) and its LLM (q/k norms, interleaved
# M-RoPE: its frequency axes once were host data copied in every LLM forward)
QWEN3_VL = [
    "--qk-layernorm", "--group-query-attention", "--num-query-groups", "2",
    "--kv-channels", "16", "--vision-model-type", "qwen3_vl", "--vision-hidden-size", "32",
    "--vision-num-layers", "2", "--vision-num-attention-heads", "2",
    "--vision-ffn-hidden-size", "64", "--patch-dim", "16",
    "--vision-deepstack-visual-indexes", "0", "--vision-num-position-embeddings", "16",
    "--min-pixels", "1024", "--max-pixels", "9216", "--video-min-pixels", "1024",
    "--video-max-pixels", "4096", "--position-embedding-type", "mrope",
    "--mrope-section", "2", "3", "3", "--mrope-interleaved"]


@pytest.mark.processes
@pytest.mark.parametrize("model", ["qwen2_5_vl", "qwen3_vl", "internvl", "whisper",
                                   "fp8_emulated"])
def test_no_host_syncs_in_the_schedule_of_each_model(digits_dir, audio_digits_dir,
                                                      tmp_path, model):
    """Every encoder family's step (the default CLIP ViT is above): Qwen2.5-VL, Qwen3-VL,
    InternViT's tiles, the Whisper-style audio encoder next to the ViT; and an FP8 LLM."""
    if model in ("qwen2_5_vl", "qwen3_vl"):
        unit = 28 if model == "qwen2_5_vl" else 32
        flags = (QWEN_VL_MODEL if model == "qwen2_5_vl" else QWEN3_VL) + [
            "--data-path", write_qwen_vl_data(str(tmp_path), unit=unit),
            "--make-vocab-size-divisible-by", "64"]
    elif model == "internvl":
        from families.internvl.internvl_data import INTERNVL_MODEL, write_internvl_digits

        flags = INTERNVL_MODEL + ["--data-path", write_internvl_digits(str(tmp_path))]
    elif model == "whisper":
        from audio_data import AUDIO_MODEL

        flags = AUDIO_MODEL + ["--data-path", audio_digits_dir]
    else:
        flags = FP8_LLM + ["--data-path", digits_dir]
    (out,) = run_distributed(train, 1, TINY_MODEL + ONE_STEP + flags, (),
                             count_step_host_syncs)
    counted = out["observed"]["host_syncs"]
    assert counted["scopes"] == 4, counted["scopes"]  # 2 forwards, 2 backwards
    assert counted["found"] == [], counted["found"]


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
        "host data to a device": lambda: torch.tensor([1, 2], device=x.device),
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
        "a device tensor to its device": lambda: x.to(x.device),  # nothing moves
        "dtype only": lambda: x.to(torch.float64),
    }
    for what, fn in free.items():
        _, counter = count_during(fn)
        assert counter.found == [], (what, counter.found)


def test_the_counter_runs_compiled_flex_attention():
    """FlexAttention (CUDA's path for media masks) is compiled, and ``torch.compile``
    refuses to trace under a dispatch mode: the counter runs the kernel outside its mode
    (``HostSyncCounter.fused``; the backward is CUDA's alone). A call that compiles keeps
    no syncs (compiling is the first step's); later lengths reuse the compiled kernel."""
    from megatron_mm.models.flex_attention import _compiled

    counter = HostSyncCounter()
    kernel = counter.fused(_compiled)
    with counter.active():
        for length in (8, 16, 24):
            q = torch.randn(1, 2, length, 4)
            assert kernel(q, q, q).shape == q.shape
    assert counter.found == [], counter.found
    assert counter.stats["compiles"] <= 1  # dynamic shapes: no compile per length
    q = torch.randn(1, 2, 8, 4)
    try:
        with pytest.raises(Exception, match="HigherOrderOperator|dispatch mode"):  # refused
            count_during(lambda: _compiled(q, q, q))
    finally:  # the refused trace leaves flex_attention's compiled code unusable
        torch._dynamo.reset()


def test_the_counter_tells_host_work_from_syncs():
    """Around the model (``host_work``) host tensors are read for free; a device value
    read, or a host tensor copied to the device blocking, still counts."""
    dev = torch.zeros(3)  # made before the count: on the device, as parameters are
    host = torch.arange(6)  # a loader's batch
    syncs = {
        "a device value read": lambda: dev.sum().item(),
        "a host tensor copied blocking": lambda: host.to(dev.device),
        "numpy data copied blocking": lambda: torch.from_numpy(host.numpy()).to(dev.device),
        # Megatron-Core's forward_step returns this token count on non-last stages
        "a CPU scalar copied blocking": lambda: torch.tensor(0, dtype=torch.int).to(
            dev.device),
        "host ops' result copied blocking": lambda: (host * 2)[:3].to(dev.device),
    }
    for what, fn in syncs.items():
        _, counter = count_during(fn, host_work=True, host=[host])
        assert len(counter.found) >= 1, what
    free = {
        "host values read": lambda: (host.tolist(), host.nonzero(), int(host[1])),
        "a non_blocking copy": lambda: host.to(dev.device, non_blocking=True),
        "a CPU scalar as an operand": lambda: dev.clone().add_(torch.tensor(1.0)),
        "made on the device": lambda: torch.arange(3, device=dev.device),
    }
    for what, fn in free.items():
        _, counter = count_during(fn, host_work=True, host=[host])
        assert counter.found == [], (what, counter.found)

"""The Qwen3-VL demo (``make demo-qwen3``): its built-in data is the Qwen2.5-VL demo's digits
drawn in 32 px cells, kept as drawn under the demo's own flags (each 32 px cell one merged
token; each clip's temporal patches after their timestamps), every sample within
--seq-length; and a two-iteration smoke run of the demo's flags on a few of its records."""

import pytest
from makefile_flags import makefile_flags

from megatron_mm.data.media import load_image
from megatron_mm.data.processing import encode_record, tokenize_record
from megatron_mm.data.records import read_records
from megatron_mm.families.qwen2_5_vl import digits as dq
from megatron_mm.families.qwen3_vl.digits import UNIT, prepare_digits_qwen3

def demo_flags() -> list:
    return makefile_flags("DEMO_QWEN3_FLAGS")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Fewer records than the demo's (the same code draws them), to stay fast."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dq, "NUM_RECORDS", {"train": 40, "valid": 40})
        out = tmp_path_factory.mktemp("digits_qwen3")
        prepare_digits_qwen3(out)
        yield out


def test_items_are_kept_as_drawn_under_the_demo_flags(data_dir):
    from megatron_mm.data.tokenizer import build_tokenizer
    from megatron_mm.startup import prepare_megatron_core

    prepare_megatron_core()
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.assembly.data_setup import media_processors
    from megatron_mm.training.config.run_config import RunConfig

    args = parse_args(demo_flags(), world_size=2)
    tok, procs = build_tokenizer(), media_processors(RunConfig.from_flags(args))
    counts = {m: p.token_count for m, p in procs.items()}
    seconds, frames = tok.tokenize(" seconds"), set()
    for rec in read_records(data_dir / "valid.jsonl"):
        sample = encode_record(rec, tok, counts, None, args.seq_length, processors=procs)
        ids = sample.tokens.tolist()
        assert ids == tokenize_record(rec, tok, counts).ids
        want = [[1, h // UNIT * 2, w // UNIT * 2] for w, h in
                (load_image(r).size for r in rec.media.get("image", []))]
        assert sample.media["image_grid_thw"].tolist() == want, rec.id
        for clip in rec.media.get("video", []):
            w, h = load_image(clip.frames[0]).size
            n = len(clip.frames)
            frames.add(n)
            assert sample.media["video_grid_thw"].tolist() == [[n // 2, h // 16, w // 16]]
            found = sum(ids[i:i + len(seconds)] == seconds for i in range(len(ids)))
            assert found == n // 2, rec.id  # "<t seconds>" before each temporal patch
    assert frames == {2, 4}


@pytest.mark.processes
def test_the_demo_flags_train(data_dir, tmp_path):
    from dist_harness import run_distributed
    from train_workers import train

    argv = demo_flags()
    argv[argv.index("--save") + 1] = str(tmp_path / "ckpt")
    argv += ["--train-iters", "2", "--micro-batch-size", "4", "--global-batch-size", "4",
             "--eval-interval", "2", "--eval-iters", "1", "--log-interval", "1",
             "--save-interval", "2", "--lr-warmup-iters", "1", "--data-path", str(data_dir)]
    (summary,) = run_distributed(train, 1, argv)
    assert len(summary["losses"]) == 2 and all(0 < x < 20 for x in summary["losses"])

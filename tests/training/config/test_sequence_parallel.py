"""``--sequence-parallel`` at TP=2 equals one process from the same initial checkpoint
(losses, gradients, parameters), sharing the references of the other equivalence tests:
TP=2; TP=2 x PP=2 with the cut inside the ViT (the ViT's hidden state and the text
embeddings travel as sequence shards); TP=2 x PP=2 with the ViT in the LLM's bubbles
(``--encoder-schedule bubble``); vision + audio (Whisper-style) encoders. Packed
micro-batches (test_balanced_training) and TP=2 x CP=2 with greedy decoding
(test_context_parallel) have their SP cases beside their references. The CLIP ViT's 17 tokens
(16 patches and the class token) are padded to 18 and the padding masked (mask type
``padding``, which TE takes too). Every norm's
weights are marked ``sequence_parallel`` (so Megatron-Core's ``finalize_model_grads``
all-reduces their gradients over the TP group; unmarked, the gradients above differ),
greedy decoding of padded prompts equals TP=1, and bad flag combinations stop with a
message naming the flags."""

import pytest
import torch
from audio_data import AUDIO_MODEL
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import assert_equal_runs, assert_norm_counted_once, merge_stages
from train_workers import train

from megatron_mm.training.cli.arguments import parse_args

TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def watch_sequence_parallel(chunks, optimizer, holder):
    """Each module's ``sequence_parallel`` setting, and every norm parameter with its
    ``sequence_parallel`` mark."""
    holder["configs"] = sorted({
        (name.split(".")[0] or "model", module.config.sequence_parallel)
        for chunk in chunks for name, module in chunk.named_modules()
        if getattr(module, "config", None) is not None})
    norms = (torch.nn.LayerNorm, torch.nn.RMSNorm)
    holder["norm_marks"] = {
        f"{name}.{p_name}": getattr(p, "sequence_parallel", None)
        for chunk in chunks for name, module in chunk.named_modules()
        if isinstance(module, norms) for p_name, p in module.named_parameters()}


def _assert_marked(ranks):
    for out in ranks:
        assert all(sp for _, sp in out["observed"]["configs"]), out["observed"]["configs"]
        marks = out["observed"]["norm_marks"]
        assert marks and all(v is True for v in marks.values()), marks


@pytest.mark.processes
@pytest.mark.parametrize("world, layout", [
    (2, TP2_SP),
    # [embedding, ViT embed, ViT 0] [ViT 1, projector, LLM]: shards of both cross the cut
    (4, TP2_SP + PP2 + ["--pipeline-partition", "3,5"]),
    # ViT 0 | ViT 1 as encoder pieces on the two stages (schedule executor)
    (4, TP2_SP + PP2 + ["--encoder-schedule", "bubble"]),
], ids=["tp2-sp", "tp2-pp2-split-vit-sp", "tp2-pp2-bubble-sp"])
def test_sequence_parallel_equals_one_process(one_process_reference, digits_dir, world,
                                             layout):
    argv, ref = one_process_reference(digits_dir)
    ranks = run_distributed(train, world, argv + layout, (1, STEPS), watch_sequence_parallel)
    _assert_marked(ranks)
    pp = 2 if PP2[0] in layout else 1
    stages = ranks[:: world // pp]  # TP rank 0 of each stage: full (TP-gathered) tensors
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for what, step, atol in (("grads", 1, 1e-6), ("grads", STEPS, 1e-6), ("params", None, 1e-5)):
        ours = merge_stages(stages, what, step)
        theirs = ref[what] if step is None else ref[what][step]
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")
    assert_norm_counted_once(ranks, ref, STEPS)


@pytest.mark.processes
def test_vision_and_audio_sequence_parallel(one_process_reference, audio_digits_dir):
    """The Whisper-style encoder's 20 frames split 10 + 10 (whole pooling windows of 2)."""
    argv, ref = one_process_reference(audio_digits_dir, AUDIO_MODEL)
    ranks = run_distributed(train, 2, argv + TP2_SP, (1, STEPS), watch_sequence_parallel)
    _assert_marked(ranks)
    assert any(n.startswith("audio_model.ln_post") for n in ranks[0]["observed"]["norm_marks"])
    assert_equal_runs(ranks[:1], ref, STEPS, holding="audio_model.decoder")


def greedy_ids(rank, argv, n_prompts):
    """Greedy continuations of the first validation prompts, each alone (their lengths
    differ, odd ones padded under SP), from the checkpoint ``--load`` names."""
    import os

    from megatron_mm.training.loop.evaluation import greedy_generate
    from megatron_mm.training.config.fp8_args import llm_sequence_multiple
    from megatron_mm.training.loop.trainer import Trainer
    from megatron_mm.training.config.run_config import RunConfig

    args = parse_args(argv, world_size=int(os.environ["WORLD_SIZE"]))
    run = Trainer.build(RunConfig.from_flags(args))
    run.load()
    out, lengths = [], []
    for i in range(n_prompts):
        sample = run.valid_ds[i]
        n = sample.prompt_len
        sample.tokens, sample.labels = sample.tokens[:n], sample.labels[:n]
        sample.loss_mask = sample.loss_mask[:n]
        lengths.append(n)
        out.append(greedy_generate(run.model_chunks, [sample], run.tokenizer.pad_id, 3, -1,
                                   run.tokenizer.base_vocab_size, run.attention,
                                   run.executor,
                                   pad_to_multiple_of=llm_sequence_multiple(
                                       run.config.fp8_settings, run.config.parallel))[0])
    return out, lengths


@pytest.mark.processes
def test_greedy_decoding_reads_the_last_real_token(one_process_reference, digits_dir):
    """Prompts padded to a multiple of TP decode as unpadded at TP=1: the next token comes
    from the last prompt token, not from the padding."""
    argv, _ = one_process_reference(digits_dir)
    ref, lengths = run_distributed(greedy_ids, 1, argv, 4)[0]
    assert any(n % 2 for n in lengths), lengths
    assert run_distributed(greedy_ids, 2, argv + TP2_SP, 4)[0][0] == ref


@pytest.mark.parametrize("argv, world, message", [
    (TP2_SP + PP2 + ["--encoder-schedule", "bubble", "--encoder-tensor-model-parallel-size",
                     "1"], 4,
     "--sequence-parallel with --encoder-tensor-model-parallel-size 1 below "
     "--tensor-model-parallel-size 2 is not supported"),
    (TP2_SP + ["--context-parallel-size", "2", "--context-parallel-block", "7"], 4,
     "--sequence-parallel with --context-parallel-size 2 needs --context-parallel-block (7) "
     "to be a multiple of --tensor-model-parallel-size (2)"),
    (TP2_SP + ["--audio-model-type", "whisper", "--audio-max-source-positions", "25"], 2,
     "--sequence-parallel splits the audio encoder's 25 frames (--audio-max-source-positions)"
     " over --tensor-model-parallel-size 2 ranks"),
    (TP2_SP + ["--audio-model-type", "whisper", "--audio-max-source-positions", "20",
               "--audio-pool-stride", "4"], 2,
     "each TP rank's 10 frames of the audio encoder must be whole windows of "
     "--audio-pool-stride 4"),
], ids=["etp-below-tp", "cp-block", "audio-frames", "audio-pool"])
def test_bad_flags_name_the_flags(capsys, monkeypatch, argv, world, message):
    from functools import partial

    from megatron_mm.training.config import transformer_impl, validation

    # as on a machine with TE installed (else its own check stops the TE case first)
    monkeypatch.setattr(validation, "validate_transformer_impl",
                        partial(transformer_impl.validate_transformer_impl, te_installed=True))
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=world)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_te_takes_the_clip_padding(monkeypatch):
    """CLIP's 17 tokens padded to 18 on TE too: its layers declare the ``padding`` mask
    type (tests/families/vit/test_vision.py), so the flags are not refused."""
    from functools import partial

    from megatron_mm.training.config import transformer_impl, validation

    monkeypatch.setattr(validation, "validate_transformer_impl",
                        partial(transformer_impl.validate_transformer_impl, te_installed=True))
    args = parse_args(TP2_SP + ["--transformer-impl", "transformer_engine"], world_size=2)
    assert args.sequence_parallel


def test_off_at_tp1_as_in_megatron():
    assert not parse_args(["--sequence-parallel"], world_size=1).sequence_parallel
    assert parse_args(TP2_SP, world_size=2).sequence_parallel


def test_llm_padding_is_one_rule_with_fp8():
    """SP pads the LLM's sequences to a multiple of TP through FP8's rule
    (``llm_sequence_multiple``); without FP8 no CP factor, without SP nothing."""
    from megatron_mm.training.config.fp8_args import llm_sequence_multiple
    from megatron_mm.training.cli.arguments import parse_run_config

    def multiple(argv, world_size):
        config = parse_run_config(argv, world_size)
        return llm_sequence_multiple(config.fp8_settings, config.parallel)

    assert multiple(TP2_SP, 2) == 2
    assert multiple(TP2_SP + ["--context-parallel-size", "2", "--context-parallel-block", "8"],
                    4) == 2
    assert multiple(TP2_SP[:2], 2) == 1
    fp8 = ["--fp8-format", "hybrid", "--fp8-emulation"]
    assert multiple(fp8 + TP2_SP, 2) == 32  # 16 rows on each TP rank's shard

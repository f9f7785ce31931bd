"""Checks of LoRA exports (tests/hf/test_lora_export.py and the Qwen2.5-VL family's): a
checkpoint with random adapters, its PEFT adapter on the transformers base and its merged
model, each against our model's logits."""

import pytest
import torch

TOLERANCE = 1e-4  # fp32, as the conversion tests
RANK, ALPHA = 4, 8.0


def _lora_checkpoint(ckpt: str, targets) -> None:
    """Iteration 1 of ``ckpt`` (an imported base): LoRA adapters on ``targets``, their A
    and B drawn at random (B starts zero: a trained adapter's is not), and the modules
    that train whole (neither frozen nor adapted: the projector) moved at random."""
    from megatron_mm.hf.convert import _build, _run_config
    from megatron_mm.models.lora import lora_adapters
    from megatron_mm.training.checkpoint.checkpointing import (load_checkpoint, save_checkpoint,
                                                               saved_args)

    run = _run_config({"load": ckpt, "save": ckpt, "lora_rank": RANK, "lora_alpha": ALPHA,
                       "lora_target_modules": targets, "no_load_optim": True,
                       "no_load_rng": True, "no_save_optim": True, "no_save_rng": True})
    lm = run.model_config.language
    padded = saved_args(run.checkpoint)["padded_vocab_size"]
    lm.vocab_size = lm.padded_vocab_size = padded
    model = _build(run.model_config, run.model)
    load_checkpoint(run, [model], None, None)
    gen = torch.Generator().manual_seed(3)
    adapters = lora_adapters(model)
    assert adapters
    with torch.no_grad():
        for _, adapter in adapters:
            for p in adapter.parameters():  # the trained ones (a fused linear's other
                if p.requires_grad:  # projections stay zero, as in training)
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        for name, p in model.named_parameters():  # what trains whole (the projector)
            if p.requires_grad and ".lora_" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    save_checkpoint(run, 1, [model], None, None, run_state={"padded_vocab_size": padded})


def _hf_logits(model, hf_dir, inputs):
    from megatron_mm.hf.compare import hf_logits
    from megatron_mm.hf.convert import _hf_config
    from megatron_mm.hf.families import family_for

    family = family_for(_hf_config(hf_dir))
    return hf_logits(model, inputs if family.hf_inputs is None
                     else family.hf_inputs(_hf_config(hf_dir), inputs))


def _ours(hf_dir, ckpt, inputs):
    from megatron_mm.hf.compare import megatron_logits, megatron_media
    from megatron_mm.hf.convert import _hf_config
    from megatron_mm.hf.families import family_for

    hf_config = _hf_config(hf_dir)
    family = family_for(hf_config)
    media = (family.media or megatron_media)(inputs)
    positions = None if family.positions is None else family.positions(hf_config, inputs)
    return megatron_logits(ckpt, inputs["input_ids"], media, 1, 1, positions)


def check_lora_exports(hf_dir, ckpt, inputs, targets, tmp_path):
    from megatron_mm.hf.compare import compare, load_hf
    from megatron_mm.hf.convert import _hf_config, export_hf
    from megatron_mm.hf.errors import ConversionError
    from megatron_mm.hf.families import family_for
    from megatron_mm.hf.world import single_rank_world
    from peft import PeftModel

    with single_rank_world():
        _lora_checkpoint(ckpt, targets)
        with pytest.raises(ConversionError, match="holds LoRA adapters: pass --lora-adapter"):
            export_hf(ckpt, str(tmp_path / "plain"))
        adapter = export_hf(ckpt, str(tmp_path / "adapter"), lora="adapter")
        merged = export_hf(ckpt, str(tmp_path / "merged"), lora="merge")
        ours = _ours(hf_dir, ckpt, inputs)
    family = family_for(_hf_config(hf_dir))
    base = load_hf(hf_dir, family)
    plain = _hf_logits(base, hf_dir, inputs)
    peft_model = PeftModel.from_pretrained(base, adapter).eval()
    theirs = _hf_logits(peft_model, hf_dir, inputs)
    ours = ours[..., :theirs.shape[-1]]
    assert (ours - plain).abs().max() > 100 * TOLERANCE  # the adapters matter
    assert (ours - theirs).abs().max() <= TOLERANCE
    diff, _ = compare(merged, ckpt, inputs)
    assert diff <= TOLERANCE
    return peft_model

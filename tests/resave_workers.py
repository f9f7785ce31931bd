"""A converted checkpoint loaded and saved again at another TP / PP / EP (a rank function
for ``dist_harness.run_distributed``): with EP > 1 each rank writes its share of the
experts."""


def save_at(rank, ckpt, out, tp, pp, ep):
    """Load ``ckpt`` at TP / PP / EP and save it to ``out`` (iteration 0, weights only)."""
    import dataclasses

    from megatron_mm.hf.compare import _Layout, checkpoint_run_config, load_converted
    from megatron_mm.training.checkpoint.checkpointing import save_checkpoint, saved_args
    from megatron_mm.training.assembly.initialize import initialize_distributed, set_random_seed

    initialize_distributed(_Layout(tp, pp, ep))
    set_random_seed(1234)
    model = load_converted(ckpt, tp, pp, ep)
    config = checkpoint_run_config(ckpt, tp, pp, ep)
    config = dataclasses.replace(config, checkpoint=dataclasses.replace(
        config.checkpoint, save=out, load=None, no_save_optim=True, no_save_rng=True))
    padded = saved_args(checkpoint_run_config(ckpt, tp, pp, ep).checkpoint)
    save_checkpoint(config, 0, [model], None, None,
                    run_state={"padded_vocab_size": padded["padded_vocab_size"]})


def export_saved_at(ckpt, root, tp, pp, ep) -> str:
    """``ckpt`` saved again at TP / PP / EP under ``root``, then exported there (the
    directory written)."""
    import shutil

    from dist_harness import run_distributed

    from megatron_mm.hf.convert import HF_SUBDIR, export_hf

    resaved = f"{root}/resaved"
    run_distributed(save_at, tp * pp * ep, ckpt, resaved, tp, pp, ep)
    shutil.copytree(f"{ckpt}/{HF_SUBDIR}", f"{resaved}/{HF_SUBDIR}")
    return export_hf(resaved, f"{root}/exported")

import pytest

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """Every tiny model: the Hugging Face model, its saved directory (5.x default layout)
    and its converted checkpoint (vocabulary padded for TP=2)."""
    import tiny_models
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("converted")
    out = {}
    with single_rank_world():
        for name in tiny_models.MODELS:
            model = tiny_models.build(name)
            hf_dir, ckpt = str(root / name / "hf"), str(root / name / "ckpt")
            model.save_pretrained(hf_dir)
            import_hf(hf_dir, ckpt, tensor_model_parallel_size=2)
            out[name] = (model, hf_dir, ckpt)
    return out


@pytest.fixture(scope="session")
def references(converted):
    """Hugging Face logits of each model on its test inputs."""
    import tiny_models

    return {name: (*tiny_models.inputs(name),
                   tiny_models.reference_logits(model, *tiny_models.inputs(name)))
            for name, (model, _, _) in converted.items()}

"""LoRA checkpoints out to Hugging Face, checked by the clients people use: the PEFT
adapter ``export --lora-adapter`` writes, loaded with the ``peft`` package on the
transformers base model the checkpoint was imported from, gives our model's logits; so does
the merged model of ``--merge-lora`` (``compare``). A LLaVA with adapters on the LLM and
the CLIP ViT, its projector trained whole (PEFT's ``modules_to_save``); one with adapters on
the projector (tests/families/qwen2_5_vl: a Qwen2.5-VL)."""

import pytest

pytest.importorskip("peft")
pytestmark = pytest.mark.processes  # checkpoints saved, the model run in forked ranks


def test_llava_adapter_loads_in_peft_and_merges(tmp_path):
    import tiny_models
    from lora_export_checks import check_lora_exports
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    hf_dir, ckpt = str(tmp_path / "hf"), str(tmp_path / "ckpt")
    tiny_models.build("llava_llama").save_pretrained(hf_dir)
    with single_rank_world():
        import_hf(hf_dir, ckpt)
    tokens, pixels = tiny_models.inputs("llava_llama")
    peft_model = check_lora_exports(
        hf_dir, ckpt, {"input_ids": tokens, "pixel_values": pixels},
        ["all-linear", "vision_model.all-linear"], tmp_path)
    adapted = {n.split(".lora_A")[0] for n, _ in peft_model.named_parameters()
               if ".lora_A" in n}
    # q, k, v, o, gate, up, down per LLM layer; q, k, v, out, fc1, fc2 per ViT layer the
    # features come from (vision_feature_layer -2: the first of two)
    assert len(adapted) == 2 * 7 + 1 * 6
    assert peft_model.peft_config["default"].modules_to_save == [
        "model.multi_modal_projector.linear_1", "model.multi_modal_projector.linear_2"]


def test_llava_projector_adapters_export(tmp_path):
    import tiny_models
    from lora_export_checks import check_lora_exports
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    hf_dir, ckpt = str(tmp_path / "hf"), str(tmp_path / "ckpt")
    tiny_models.build("llava_llama").save_pretrained(hf_dir)
    with single_rank_world():
        import_hf(hf_dir, ckpt)
    tokens, pixels = tiny_models.inputs("llava_llama")
    check_lora_exports(hf_dir, ckpt, {"input_ids": tokens, "pixel_values": pixels},
                       ["q_proj", "vision_projection.all-linear"], tmp_path)

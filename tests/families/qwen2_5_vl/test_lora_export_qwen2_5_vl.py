"""Qwen2.5-VL's LoRA exports: adapters on the LLM (a subset of its projections) and on
its ViT, whose fused ``qkv`` becomes one PEFT LoRA of rank 3r; the adapter loaded with
``peft`` on the transformers base and the merged model both give our model's logits."""

import pytest

pytest.importorskip("peft")
pytestmark = pytest.mark.processes  # checkpoints saved, the model run in forked ranks


def test_qwen2_5_vl_adapter_loads_in_peft_and_merges(tmp_path):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world
    from lora_export_checks import check_lora_exports
    from test_convert_qwen2_5_vl import _inputs, _processor_config, _tiny

    hf_dir, ckpt = tmp_path / "hf", str(tmp_path / "ckpt")
    _tiny().save_pretrained(str(hf_dir))
    _processor_config(hf_dir, min_pixels=784, max_pixels=50176)
    with single_rank_world():
        import_hf(str(hf_dir), ckpt)
    check_lora_exports(str(hf_dir), ckpt, _inputs(),
                       ["q_proj", "v_proj", "down_proj", "vision_model.all-linear"], tmp_path)

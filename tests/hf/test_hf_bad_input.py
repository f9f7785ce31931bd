"""Bad input stops the converter (tools/convert_hf.py) with a message naming the problem."""

import importlib.util
import os

import pytest
import tiny_models
import torch

_spec = importlib.util.spec_from_file_location(
    "convert_hf", os.path.join(os.path.dirname(__file__), "..", "..", "tools", "convert_hf.py"))
convert_hf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_hf)


def _convert(capsys, hf_dir, save, *extra):
    code = convert_hf.main(["import", "--hf-dir", str(hf_dir), "--save", str(save), *extra])
    return code, capsys.readouterr().err


def test_unsupported_architecture_lists_the_supported_ones(capsys, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)).save_pretrained(
        tmp_path / "gpt2")
    code, err = _convert(capsys, tmp_path / "gpt2", tmp_path / "ckpt")
    assert code == 2
    assert "unsupported architecture ['GPT2LMHeadModel']" in err
    assert "LlavaForConditionalGeneration" in err and "Qwen3ForCausalLM" in err


def test_shape_mismatch_names_the_tensor(capsys, tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_models.build("llama").save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = torch.zeros(8, 64)  # 16 x 64 in a model with 2 key/value heads of 8
    save_file(tensors, path, metadata={"format": "pt"})
    code, err = _convert(capsys, tmp_path / "hf", tmp_path / "ckpt")
    assert code == 2
    assert ("shape mismatch for language_model.decoder.layers.1.self_attention.linear_qkv."
            "weight" in err) and f"{name} 8x64" in err


def test_tensor_parallel_size_must_divide_the_kv_heads(capsys, tmp_path):
    tiny_models.build("qwen2").save_pretrained(tmp_path / "hf")
    code, err = _convert(capsys, tmp_path / "hf", tmp_path / "ckpt",
                         "--tensor-model-parallel-size", "4")
    assert code == 2
    assert "--tensor-model-parallel-size 4 does not divide the 2 key/value heads" in err


def test_loading_at_a_tp_that_does_not_divide_the_kv_heads(capsys, converted):
    from megatron_mm.training.cli.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--load", converted["qwen2"][2], "--tensor-model-parallel-size", "4"],
                   world_size=4)
    assert "--num-query-groups (2) is not divisible by --tensor-model-parallel-size (4)" in (
        capsys.readouterr().err)


def test_flags_that_disagree_with_the_checkpoint(capsys, converted):
    from megatron_mm.training.cli.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--load", converted["qwen2"][2], "--hidden-size", "128"], world_size=1)
    assert "--hidden-size 128 disagrees with the checkpoint" in capsys.readouterr().err

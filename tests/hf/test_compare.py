"""`convert_hf.py compare`: a tiny LLaVA imported with `convert_hf.py import`, then
compared with its Hugging Face model at TP=1 (this process) and TP=2 (two processes the
tool starts); inputs the family does not take stop it with one line naming the key."""

import importlib.util
import os

import pytest
import tiny_models
import torch

TOLERANCE = 1e-4

_spec = importlib.util.spec_from_file_location(
    "convert_hf", os.path.join(os.path.dirname(__file__), "..", "..", "tools", "convert_hf.py"))
convert_hf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_hf)


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    hf_dir, ckpt = str(root / "hf"), str(root / "ckpt")
    tiny_models.build("llava_llama").save_pretrained(hf_dir)
    assert convert_hf.main(["import", "--hf-dir", hf_dir, "--save", ckpt,
                            "--tensor-model-parallel-size", "2"]) == 0
    tokens, pixels = tiny_models.inputs("llava_llama")
    inputs = str(root / "inputs.pt")
    torch.save({"input_ids": tokens, "pixel_values": pixels,
                "attention_mask": torch.ones_like(tokens)}, inputs)
    return root, hf_dir, ckpt, inputs


def _compare(capsys, hf_dir, ckpt, inputs, *extra):
    code = convert_hf.main(["compare", "--hf-dir", hf_dir, "--load", ckpt,
                            "--inputs", inputs, *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.processes)],
                         ids=["TP1", "TP2"])
def test_compare_prints_the_logit_difference(capsys, llava, tp):
    _, hf_dir, ckpt, inputs = llava
    code, out, err = _compare(capsys, hf_dir, ckpt, inputs,
                              "--tensor-model-parallel-size", str(tp))
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    prefix = "max abs logit difference: "
    assert last.startswith(prefix), out
    diff = float(last[len(prefix):])
    with capsys.disabled():
        print(f"llava_llama TP={tp}: {last}")
    assert diff <= TOLERANCE


@pytest.mark.parametrize("key, value, message", [
    ("input_features", torch.zeros(2, 16, 40),
     "--inputs key 'input_features' is not an input of LlavaForConditionalGeneration"),
    ("attention_mask", torch.tensor([[1] * 11 + [0]] * 2),
     "--inputs key 'attention_mask' has zeros (padding)"),
], ids=["audio_input_to_llava", "padding_mask"])
def test_inputs_the_family_does_not_take(capsys, llava, key, value, message):
    root, hf_dir, ckpt, _ = llava
    tokens, pixels = tiny_models.inputs("llava_llama")
    path = str(root / f"bad_{key}.pt")
    torch.save({"input_ids": tokens, "pixel_values": pixels, key: value}, path)
    code, out, err = _compare(capsys, hf_dir, ckpt, path)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "max abs logit difference" not in out


@pytest.mark.parametrize("name, ep, message", [
    ("qwen3", 2, "--expert-model-parallel-size needs an MoE LLM (--num-experts); this "
                 "LLM is dense"),
    ("qwen3_moe", 3, "--num-experts (4) is not divisible by --expert-model-parallel-size "
                     "(3)"),
])
def test_compare_refuses_a_bad_expert_parallel_size(capsys, converted, tmp_path, name, ep,
                                                    message):
    _, hf_dir, ckpt = converted[name]
    inputs = str(tmp_path / "inputs.pt")
    torch.save({"input_ids": torch.ones(1, 4, dtype=torch.long)}, inputs)
    code, _, err = _compare(capsys, hf_dir, ckpt, inputs, "--expert-model-parallel-size",
                            str(ep))
    assert code == 2
    assert message in err.strip().splitlines()[-1]

"""A family outside the package is one folder plus one registry line: a renamed copy of the
``vit`` family, written to a temporary folder and named in ``$MEGATRON_MM_FAMILIES``,
converts from and back to Hugging Face bit for bit and trains through the pretrain script
(its checkpoint-saving helper processes included), with nothing in the package edited."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ROOT / "megatron_mm" / "families"
ARCH = "ToyLlavaForConditionalGeneration"


def copy_family(src: Path, dst: Path) -> None:
    """``src`` as the top-level package ``dst.name``: its relative imports of the package
    made absolute, its encoder types and Hugging Face architectures renamed (toyclip,
    toysiglip, ToyLlava...)."""
    dst.mkdir()
    for f in src.glob("*.py"):
        text = re.sub(r"from \.\.\.(\w)", r"from megatron_mm.\1", f.read_text())
        text = re.sub(r"from \.\.(\w)", r"from megatron_mm.families.\1", text)
        text = text.replace(f"megatron_mm.families.{src.name}", dst.name)
        for old, new in (('"clip"', '"toyclip"'), ('"siglip"', '"toysiglip"'),
                         ('"Llava', '"ToyLlava'), (f'Family("{src.name}"', f'Family("{dst.name}"')):
            text = text.replace(old, new)
        (dst / f.name).write_text(text)


def tiny_llava(vocab: int, image_token: int):
    """A random LLaVA (CLIP 28 px / 14 px patches + Llama)."""
    import transformers
    from transformers import AutoConfig

    text = AutoConfig.for_model("llama", vocab_size=vocab, hidden_size=64,
                                intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=256, tie_word_embeddings=False)
    vision = AutoConfig.for_model("clip_vision_model", hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=2, image_size=28,
                                  patch_size=14)
    config = AutoConfig.for_model("llava", text_config=text.to_dict(),
                                  vision_config=vision.to_dict(), image_token_index=image_token,
                                  vision_feature_layer=-2)
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(config).eval()


# The scripts one after another in one interpreter, each run as ``python SCRIPT ARGS`` runs
# it (``__main__``, its own sys.argv; a non-zero exit stops there): one start-up and import
# for all of them. The pretrain script's checkpoint-saving helpers are started from here.
STEPS = """
import json, runpy, sys
for argv in json.loads(sys.argv[1]):
    print("step:", *argv, flush=True)
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
"""


def run(tmp_path, *steps):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    env["MEGATRON_MM_FAMILIES"] = "toyvit"
    steps = json.dumps([[str(a) for a in step] for step in steps])
    return subprocess.run([sys.executable, "-c", STEPS, steps], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_family_from_a_folder_converts_and_trains(tmp_path):
    import transformers
    from megatron.core import dist_checkpointing

    from megatron_mm.data import build_tokenizer
    from megatron_mm.hf.families import ConversionError, family_for
    from megatron_mm.data.digits import prepare_digits
    from megatron_mm.training.checkpoint.checkpointing import iteration_dir

    copy_family(FAMILIES / "vit", tmp_path / "toyvit")
    tok = build_tokenizer("MistralV1SentencePiece", None)  # the demo's: no tokenizer files
    model = tiny_llava(tok.vocab_size, tok.media_token_id("image"))
    hf_dir, ckpt = tmp_path / "hf", tmp_path / "ckpt"
    model.save_pretrained(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "architectures": [ARCH]}))
    convert = ROOT / "tools" / "convert_hf.py"

    # unregistered (this process has no $MEGATRON_MM_FAMILIES): the converter refuses it
    with pytest.raises(ConversionError, match=re.escape(f"unsupported architecture ['{ARCH}']")):
        family_for(SimpleNamespace(architectures=[ARCH], model_type="llava"))

    prepare_digits(tmp_path / "digits")
    done = run(tmp_path,
               [convert, "import", "--hf-dir", hf_dir, "--save", ckpt],
               [convert, "export", "--load", ckpt, "--hf-dir", tmp_path / "back"],
               [ROOT / "examples" / "pretrain_mllm.py", "--load", ckpt, "--save", ckpt,
                "--data-path", tmp_path / "digits", "--micro-batch-size", "2",
                "--train-iters", "2", "--lr", "1e-3", "--log-interval", "1",
                "--eval-iters", "1", "--skip-final-eval"],
               [convert, "export", "--load", ckpt, "--hf-dir", tmp_path / "out"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    back = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "back")
    assert back.config.architectures == [ARCH]
    before, after = model.state_dict(), back.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)

    saved = dist_checkpointing.load_common_state_dict(iteration_dir(str(ckpt), 2))["args"]
    assert saved.vision_model_type == "toyclip"  # Megatron-LM's form: a Namespace
    out = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "out")
    assert not torch.equal(out.state_dict()["lm_head.weight"], before["lm_head.weight"])

"""The family registry: every family declares what the package needs, the registry
stays torch-free, and a new family reaches the flags and the model config through its own
module plus one registry entry."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.families import FAMILIES, SLOTS, family, resolve
from megatron_mm.plan.pipeline.layers import ENCODER_KINDS
from megatron_mm.training.cli.arguments import build_parser
from megatron_mm.training.config.model_config import build_model_config
from megatron_mm.training.config.run_config import group_of_flags

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.processes
def test_registry_imports_no_torch():
    code = ("import sys, megatron_mm.families\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_is_complete(model_type):
    """Flags -> config -> planner spec, and its torch-side builders resolve."""
    fam = family(model_type)
    args = build_parser().parse_args(
        [f"--{fam.slot}-model-type", model_type]
        + (["--vision-model-type", "none"] if fam.slot != "vision" else []))
    config = build_model_config(group_of_flags("model", args))
    enc = config.encoders[fam.slot]
    assert isinstance(enc, fam.config_class)
    spec = fam.planner_spec(fam.slot, enc, 2, {})
    assert f"{spec.modality}_layer" in ENCODER_KINDS and spec.items_per_sample == 2
    assert callable(resolve(fam.build)) and callable(resolve(fam.media))
    assert fam.slot in SLOTS and fam.modality


def test_unknown_family_names_the_registered_ones():
    with pytest.raises(ConfigError, match="unknown encoder model type 'nope'.*clip"):
        family("nope")


TOY_FAMILY = """
import dataclasses

from megatron_mm.families import Family
from megatron_mm.families.vit.encoder import CLIP


@dataclasses.dataclass
class ToyConfig:
    model_type: str = "toy"
    width: int = 3
    flag_prefix: str = "--vision-"
    hidden_size: int = 8
    num_attention_heads: int = 2
    ffn_hidden_size: int = 16


@dataclasses.dataclass(frozen=True)
class ToyFlags:
    toy_width: int = 3
    '''the toy's width'''


FAMILY = Family("toy", encoders=(dataclasses.replace(
    CLIP, model_type="toy", config_class=ToyConfig,
    from_model_args=lambda model: ToyConfig(width=model.families[ToyFlags].toy_width),
    flags=ToyFlags, checkpoint_flags=("toy_width",)),))
"""


@pytest.mark.processes
def test_a_new_family_is_one_registry_entry(tmp_path):
    """A family registered with its own flag is a --vision-model-type choice, parses its
    flag into the model group and builds its config; nothing else is edited."""
    (tmp_path / "toyfam.py").write_text(TOY_FAMILY)
    code = ("from megatron_mm.startup import prepare_megatron_core\n"
            "prepare_megatron_core()\n"
            "from megatron_mm.training.cli.arguments import build_parser\n"
            "from megatron_mm.training.config.model_config import build_model_config\n"
            "from megatron_mm.training.config.run_config import group_of_flags\n"
            "args = build_parser().parse_args(['--vision-model-type', 'toy', '--toy-width', '5'])\n"
            "print(build_model_config(group_of_flags('model', args)).encoders['vision'])")
    env = dict(os.environ, MEGATRON_MM_FAMILIES="toyfam",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ToyConfig(model_type='toy', width=5, flag_prefix='--vision-', " \
        "hidden_size=8, num_attention_heads=2, ffn_hidden_size=16)"


def test_freeze_flag_needs_its_slot():
    args = build_parser().parse_args(["--freeze-audio"])
    with pytest.raises(ConfigError, match="--freeze-audio needs an audio encoder"):
        build_model_config(group_of_flags("model", args))

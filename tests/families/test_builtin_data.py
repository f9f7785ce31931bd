"""Which built-in data a model trains on without --data-path: the first family's (in
encoder order) whose records hold every modality the model reads."""
import dataclasses

import pytest

from megatron_mm.families.whisper.config import AudioEncoderConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.families import FAMILIES, builtin_data_for, resolve
from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig
from megatron_mm.families.qwen3_vl.config import Qwen3VLVisionConfig

CLIP, WHISPER = VisionEncoderConfig(), AudioEncoderConfig()
SIGLIP = dataclasses.replace(CLIP, model_type="siglip")
QWEN = Qwen2_5VLVisionConfig(hidden_size=32, num_layers=2, num_attention_heads=4,
                             fullatt_block_indexes=(1,))
QWEN3 = Qwen3VLVisionConfig(hidden_size=32, num_layers=2, num_attention_heads=4,
                            deepstack_visual_indexes=(0,))


@pytest.mark.parametrize("encoders, name", [
    ([CLIP], "digits"), ([SIGLIP], "digits"),
    ([CLIP, WHISPER], "spoken_digits"),  # CLIP's digits hold no audio: Whisper's data
    ([WHISPER], "spoken_digits"),
    ([QWEN], "digits_qwen"), ([QWEN3], "digits_qwen3"),
])
def test_the_family_data_holding_every_modality(encoders, name):
    data = builtin_data_for(encoders)
    assert data.name == name
    assert callable(resolve(data.prepare))


def test_none_when_no_family_data_holds_them(monkeypatch):
    # Qwen2.5-VL's images + video with Whisper's audio: no one data set holds all three
    assert builtin_data_for([QWEN, WHISPER]) is None
    monkeypatch.setitem(FAMILIES, "clip", dataclasses.replace(FAMILIES["clip"],
                                                              builtin_data=None))
    assert builtin_data_for([CLIP]) is None

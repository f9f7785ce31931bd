"""Qwen3.5: Qwen3-VL's vision encoder without DeepStack (``--vision-model-type qwen3_vl``,
no ``--vision-deepstack-visual-indexes``) in front of a hybrid LLM: Gated DeltaNet
(linear attention) layers and every Nth layer full attention with an output gate and
partial rotary, interleaved M-RoPE, zero-centred norms (``models/linear_attention.py``);
converts as ``Qwen3_5ForConditionalGeneration``. Its processor is Qwen3-VL's
(transformers maps ``qwen3_5`` to ``Qwen3VLProcessor``): images and clips with timestamps
come through ``families/qwen3_vl``."""

from ..record import Family

FAMILY = Family("qwen3_5", architectures=("Qwen3_5ForConditionalGeneration",),
                text_models=("qwen3_5_text",),
                conversion="megatron_mm.families.qwen3_5.hf")

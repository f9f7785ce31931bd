"""On-disk key layouts of one architecture, normalised to transformers 5's in-memory names.

Hugging Face checkpoints of the same model exist under several prefixes (hub files from
transformers 4.x, 4.52-4.57 saves, 5.x saves). Import maps each alias prefix to the
canonical one (longest prefix first); export writes the legacy hub layout, which
transformers 4.x and 5.x both load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Tuple


@dataclass(frozen=True)
class Layout:
    aliases: Tuple[Tuple[str, str], ...]  # (on-disk prefix, canonical prefix)
    export: Tuple[Tuple[str, str], ...]  # (canonical prefix, on-disk prefix)

    def canonical(self, name: str) -> str:
        return _rename(name, self.aliases)

    def on_disk(self, name: str) -> str:
        return _rename(name, self.export)

    def normalise(self, tensors: Mapping) -> Dict:
        out = {}
        for name, t in tensors.items():
            new = self.canonical(name)
            if new in out:
                raise ValueError(f"tensors {name} and another one both map to {new}")
            out[new] = t
        return out


def _rename(name: str, table) -> str:
    for old, new in sorted(table, key=lambda p: -len(p[0])):
        if name.startswith(old):
            return new + name[len(old):]
    return name


# Llama / Mistral / Qwen2 / Qwen3: the same names everywhere.
CAUSAL_LM = Layout(aliases=(), export=())

# LLaVA-1.5 and LLaVA-OneVision (hf-offline notes, section 3).
LLAVA = Layout(
    aliases=(
        ("language_model.model.", "model.language_model."),  # hub 4.x, 5.x save
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.vision_model.", "model.vision_tower."),  # hub 4.x
        ("model.vision_tower.vision_model.", "model.vision_tower."),  # 4.52-4.57 save
        ("vision_tower.", "model.vision_tower."),  # 5.x save
        ("multi_modal_projector.", "model.multi_modal_projector."),
        ("image_newline", "model.image_newline"),
    ),
    export=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower.vision_model."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
    ),
)

# Qwen2-Audio (hf-offline notes, section 3): hub files use the legacy prefixes.
QWEN2_AUDIO = Layout(
    aliases=(
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("audio_tower.", "model.audio_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ),
    export=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.audio_tower.", "audio_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ),
)

# InternVL (-hf hub checkpoints and transformers 5 saves: the legacy prefixes; transformers
# 5's in-memory names load as they are).
INTERNVL = Layout(
    aliases=(
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("language_model.", "model.language_model."),  # transformers 5 loads it too
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ),
    export=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ),
)

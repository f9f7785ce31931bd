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

    def recorded(self, tensors: Mapping) -> Dict:
        """What import remembers of the on-disk tensors (saved in the checkpoint's
        ``hf/``) for export to write them the same way: nothing here."""
        return {}

    def written(self, tensors: Mapping, recorded: Mapping = None) -> Dict:
        """The tensors export writes, by their on-disk names (``normalise`` undone);
        ``recorded``: what ``recorded`` kept at import (None: unknown)."""
        return {self.on_disk(name): t for name, t in tensors.items()}


def _rename(name: str, table) -> str:
    for old, new in sorted(table, key=lambda p: -len(p[0])):
        if name.startswith(old):
            return new + name[len(old):]
    return name


# Llama / Mistral / Qwen2 / Qwen3: the same names everywhere.
CAUSAL_LM = Layout(aliases=(), export=())

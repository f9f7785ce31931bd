"""The Hugging Face sidecar of a converted checkpoint (``<checkpoint>/hf/``: config,
tokenizer, image processor, tensors the model does not use), carried along when a run
``--load``s one directory and ``--save``s to another, so export works on either."""

from __future__ import annotations

import os
import shutil
from typing import Optional

SIDECAR = "hf"


def carry_sidecar(load: Optional[str], save: str) -> bool:
    """Copy ``load``'s sidecar into ``save`` where ``save`` has none; whether it copied.
    The copy lands under a temporary name and is renamed, so a crash leaves none half
    written."""
    if not load or os.path.abspath(load) == os.path.abspath(save):
        return False
    src, dst = os.path.join(load, SIDECAR), os.path.join(save, SIDECAR)
    if not os.path.isdir(src) or os.path.exists(dst):
        return False
    staging = dst + ".inprogress"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging)
    os.replace(staging, dst)
    return True

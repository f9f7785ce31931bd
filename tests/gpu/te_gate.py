"""Whether a test that needs Transformer Engine runs, skips or fails on this machine.

Without CUDA: skipped (every CPU machine). On CUDA: TE must import, or the test FAILS with
TE's own error (an install that builds TE against another torch must not pass as
"skipped"), unless ``MEGATRON_MM_GPU_TESTS_WITHOUT_TE=1`` says this node has no TE
(``make gpu-check`` on a node without TE): then skipped as absent."""

from __future__ import annotations

from typing import Optional, Tuple

WITHOUT_TE = "MEGATRON_MM_GPU_TESTS_WITHOUT_TE"


def te_gate(cuda: bool, te_error: Optional[str], without_te: bool) -> Tuple[str, str]:
    """("run" | "skip" | "fail", reason). ``te_error``: None when TE imports
    (``te_import.import_error``)."""
    if not cuda:
        return "skip", "needs a CUDA device"
    if te_error is None:
        return "run", ""
    if without_te:
        return "skip", f"Transformer Engine absent ({WITHOUT_TE}=1): {te_error}"
    return "fail", (f"Transformer Engine does not import on this CUDA machine: {te_error}. "
                    "Install it (docs/gpu.md), or set "
                    f"{WITHOUT_TE}=1 where the node has no TE (the tests then skip)")

"""The GPU tests' Transformer Engine gate (runs on any machine): on CUDA a TE that does not
import fails the TE tests, unless MEGATRON_MM_GPU_TESTS_WITHOUT_TE=1 marks a node without
TE (skipped, "absent"); without CUDA they skip."""

from te_gate import WITHOUT_TE, te_gate

ERROR = "ImportError: libcudnn.so.9: cannot open shared object file"


def test_cuda_without_te_fails_with_tes_error():
    action, reason = te_gate(cuda=True, te_error=ERROR, without_te=False)
    assert action == "fail" and ERROR in reason and WITHOUT_TE in reason


def test_a_node_declared_without_te_skips_as_absent():
    action, reason = te_gate(cuda=True, te_error=ERROR, without_te=True)
    assert action == "skip" and "absent" in reason


def test_te_and_cuda_run_and_no_cuda_skips():
    assert te_gate(cuda=True, te_error=None, without_te=False)[0] == "run"
    assert te_gate(cuda=True, te_error=None, without_te=True)[0] == "run"
    assert te_gate(cuda=False, te_error=ERROR, without_te=False) == ("skip",
                                                                     "needs a CUDA device")

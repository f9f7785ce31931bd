"""An encoder piece (a range of its layers, run as its own action) recomputes what
Megatron-Core's ``--recompute-granularity full`` recomputes of the rank's block."""

from types import SimpleNamespace

import pytest

from megatron_mm.models.encoder_parts import EncoderParts


def _parts(method, n, first_layer=5, layers=4, training=True):
    parts = EncoderParts()
    parts.training = training
    parts.decoder = SimpleNamespace(
        config=SimpleNamespace(recompute_granularity=None if method is None else "full",
                               recompute_method=method, recompute_num_layers=n),
        layers=[SimpleNamespace(layer_number=first_layer + i + 1) for i in range(layers)])
    return parts


def _groups(parts, start, end):
    return [([l.layer_number - 1 for l in layers], recompute)
            for layers, recompute in parts._piece_groups(start, end)]


@pytest.mark.parametrize("method, n, piece, expected", [
    # this rank holds encoder layers 5-8 (block-local 0-3)
    (None, None, (5, 9), [([5, 6, 7, 8], False)]),
    ("uniform", 2, (5, 9), [([5, 6], True), ([7, 8], True)]),
    ("uniform", 2, (6, 9), [([6], True), ([7, 8], True)]),  # a group cut by the piece
    ("block", 2, (5, 9), [([5], True), ([6], True), ([7, 8], False)]),
    ("block", 2, (6, 8), [([6], True), ([7], False)]),
])
def test_pieces_recompute_as_megatron_does_the_block(method, n, piece, expected):
    assert _groups(_parts(method, n), *piece) == expected


def test_no_recompute_without_autograd_or_in_eval():
    import torch

    assert _groups(_parts("block", 4, training=False), 5, 9) == [([5, 6, 7, 8], False)]
    with torch.no_grad():
        assert _groups(_parts("block", 4), 5, 9) == [([5, 6, 7, 8], False)]


@pytest.mark.parametrize("fp8, recipe, expected", [
    (None, "delayed", [(5, []), (6, [])]),
    ("hybrid", "delayed", [(5, [-1]), (6, [-1])]),         # one context around the run
    ("hybrid", "tensorwise", [(5, [5]), (6, [6])]),        # one per layer (global number)
])
def test_pieces_enter_the_fp8_context_as_transformer_block_does(monkeypatch, fp8, recipe,
                                                                expected):
    """A piece runs layers outside TransformerBlock.forward, so it must enter Megatron-Core's
    ``get_fp8_context`` itself (without TE that is a null context: recorded here instead)."""
    import contextlib

    from megatron_mm.models import fp8_context

    active, calls = [], []

    @contextlib.contextmanager
    def recording_context(config, layer_no=-1, is_init=False):
        active.append(layer_no)
        yield
        active.pop()

    class Layer:
        def __init__(self, number, config):
            self.layer_number, self.config = number, config

        def __call__(self, hidden_states, attention_mask):
            calls.append((self.layer_number - 1, list(active)))
            return hidden_states, None

    monkeypatch.setattr(fp8_context.fp8_utils, "get_fp8_context", recording_context)
    parts = _parts(None, None, first_layer=5, layers=2)
    parts.decoder.pg_collection = SimpleNamespace(tp=None)
    config = parts.decoder.config
    config.fp8, config.fp8_recipe, config.distribute_saved_activations = fp8, recipe, False
    parts.decoder.layers = [Layer(6, config), Layer(7, config)]
    assert parts.layers("hidden", 5, 7) == "hidden"
    assert calls == expected


@pytest.mark.parametrize("emulated, fp8, expected", [
    (False, "hybrid", "te"),            # Transformer Engine FP8: TE's checkpoint
    (False, None, "tensor_parallel"),   # BF16
    (True, "hybrid", "tensor_parallel"),  # the CPU emulation runs local layers
])
def test_recomputed_pieces_take_tes_checkpoint_under_te_fp8(monkeypatch, emulated, fp8,
                                                            expected):
    """TE's checkpoint restores the FP8 scaling state for the recomputed forward
    (Megatron-Core's checkpointed_forward picks it for FP8 the same way)."""
    import megatron.core.extensions.transformer_engine as te_ext
    from megatron.core import tensor_parallel

    used = []

    def te(run, distribute, rng_tracker, tp_group, hidden):
        used.append(("te", tp_group))
        return run(hidden)

    def local(run, distribute, hidden):
        used.append(("tensor_parallel", None))
        return run(hidden)

    monkeypatch.setattr(te_ext, "te_checkpoint", te)
    monkeypatch.setattr(tensor_parallel, "checkpoint", local)
    parts = _parts("uniform", 2, first_layer=5, layers=2)
    parts.decoder.pg_collection = SimpleNamespace(tp="encoder tp group")
    config = parts.decoder.config
    config.fp8, config.fp8_recipe, config.distribute_saved_activations = fp8, "tensorwise", False
    config.fp8_emulation, config.tp_only_amax_red = emulated, False
    config.fp8_margin, config.fp8_amax_history_len, config.fp8_amax_compute_algo = 0, 1, "max"
    parts.decoder.layers = [_IdentityLayer(6, config), _IdentityLayer(7, config)]
    assert parts.layers("hidden", 5, 7) == "hidden"
    assert used == [(expected, "encoder tp group" if expected == "te" else None)]


class _IdentityLayer:
    def __init__(self, number, config):
        self.layer_number, self.config = number, config

    def __call__(self, hidden_states, attention_mask):
        return hidden_states, None

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

    from megatron_mm.models import encoder_parts

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

    monkeypatch.setattr(encoder_parts, "get_fp8_context", recording_context)
    parts = _parts(None, None, first_layer=5, layers=2)
    config = parts.decoder.config
    config.fp8, config.fp8_recipe, config.distribute_saved_activations = fp8, recipe, False
    parts.decoder.layers = [Layer(6, config), Layer(7, config)]
    assert parts.layers("hidden", 5, 7) == "hidden"
    assert calls == expected

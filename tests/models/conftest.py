import pytest


@pytest.fixture
def te_placeholder_specs(monkeypatch):
    """``get_layer_specs("transformer_engine")`` run through on Megatron-Core's TE spec
    code: without TE its TE classes are placeholders, enough to read the specs' structure
    (never to build a layer)."""
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.models.gpt import gpt_layer_specs

    from megatron_mm.models import specs

    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", TESpecProvider)
    monkeypatch.setattr(specs, "transformer_engine_available", lambda: True)
    return specs.get_layer_specs

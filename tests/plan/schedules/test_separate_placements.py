"""The modules each rank of the separate placement builds: the encoder ranks every encoder
whole, the LLM's chunk 0 the output norms and projectors, so every module is built once
over the ranks (the colocated model's names, the checkpoint's keys)."""

from megatron_mm.plan import StagePartition
from megatron_mm.plan.pipeline.placement import whole_model
from megatron_mm.plan.schedules.encoder_pipeline import split_chain
from megatron_mm.plan.schedules.separate_placements import separate_model_placements

from helpers import vlm_chain


def test_encoder_ranks_hold_the_encoders_whole_and_llm_chunk_0_the_projector():
    chain = vlm_chain(3, 4)
    llm = StagePartition(2, 1, [3, 3])  # [embed, LLM 0-1] [LLM 2-3, head]
    places = separate_model_placements(chain, llm)
    vit = places.encoder.encoder("vision")
    assert (vit.embed, vit.layers, vit.projector) == (True, [0, 3], False)
    assert places.encoder.encoder_separate and not places.encoder.runs_llm
    assert not places.encoder.llm_embed
    first = places.llm[0].encoder("vision")
    assert (first.embed, first.num_layers, first.projector) == (False, 0, True)
    assert places.llm[1].encoder("vision") is None
    assert [p.llm_layers for p in places.llm] == [[0, 2], [2, 4]]
    assert [(p.name, p.layers) for p in places.pieces] == [("vision", [[0, 3]])]
    # every module once: what the colocated model holds in one chunk
    whole = whole_model(chain).encoder("vision")
    assert (vit.embed, vit.layers, first.projector) == (whole.embed, whole.layers,
                                                        whole.projector)
    assert len(split_chain(chain)[0]) == len(places.pieces)

"""Build the layer chain of a model for a workload.

Order: the LLM's word embedding; for each encoder, its embedding, transformer layers and
projector; then the LLM decoder layers and output layer + loss. The word embedding comes
first because Megatron-Core keeps it on the first pipeline stage (its pipeline layout and the
tied-embedding group require it); the text embeddings then travel with the encoder
activations, and each projector merges its features into them. Module names are those of
``megatron_mm.models.MultimodalModel`` so the runtime maps a plan onto the model.
"""

from __future__ import annotations

from typing import List

from ..costs import flops
from ..errors import PlanError
from ..model import ModelSpec, Workload
from .layers import LLM, Layer, resolve_backward


def build_chain(model: ModelSpec, workload: Workload) -> List[Layer]:
    media = model.media_tokens_per_sample
    if media > workload.seq_length:
        raise PlanError(f"--seq-length ({workload.seq_length}) is shorter than the media tokens "
                        f"per sample ({media}); raise --seq-length or send fewer media items")
    b, tp = workload.micro_batch_size, workload.tensor_model_parallel_size
    chain: List[Layer] = []

    def add(kind, module, branch, cost, trainable, recompute=False):
        cost = cost.split(tp)
        chain.append(Layer(kind=kind, module=module, branch=branch, fwd_flops=cost.fwd,
                           dgrad_flops=cost.dgrad, wgrad_flops=cost.wgrad, params=cost.params,
                           act_bytes=cost.act, recompute_act_bytes=cost.recompute_act,
                           out_bytes=cost.out, trainable=trainable, recompute=recompute))

    llm_trainable = not model.freeze_llm
    tokens = b * workload.seq_length
    deepstack = None  # (LLM layers that add DeepStack features, bytes of one)
    add("llm_embed", "language_model.embedding", LLM, flops.llm_embed(model.llm, tokens),
        llm_trainable)

    for enc in model.encoders:
        trainable = enc.name not in model.frozen_encoders
        sequences = b * enc.items_per_sample
        root = f"{enc.name}_model"
        add(f"{enc.modality}_embed", root, enc.name, flops.encoder_embed(enc, sequences),
            trainable)
        layer = flops.transformer_layer(enc.transformer, sequences, enc.tokens_per_item,
                                        causal=False, spans=enc.attention_spans)
        for i in range(enc.transformer.num_layers):
            add(f"{enc.modality}_layer", f"{root}.decoder.layers.{i}", enc.name, layer,
                trainable, workload.recompute)
            # a cut after it sends the DeepStack layers' outputs so far beside its own
            chain[-1].deepstack_bytes = chain[-1].out_bytes * sum(
                d <= i for d in enc.deepstack_layers)
        add("projector", f"{enc.name}_projection", enc.name,
            flops.projector(enc, model.llm.hidden_size, sequences),
            enc.name not in model.frozen_projectors)
        if enc.deepstack_layers:  # one merged feature per DeepStack layer, each as large
            deepstack = (len(enc.deepstack_layers), chain[-1].out_bytes)
            chain[-1].deepstack_bytes = deepstack[0] * deepstack[1]

    ep = workload.expert_model_parallel_size
    a2a = flops.all_to_all_bytes(model.llm, tokens, ep) / tp  # sequence parallel: 1 / TP
    for i in range(model.llm.num_layers):
        moe = model.llm.is_moe(i)
        add("llm_layer", f"language_model.decoder.layers.{i}", LLM,  # its own kind's cost
            flops.llm_layer(model.llm, i, b, workload.seq_length), llm_trainable,
            workload.recompute)
        if moe:  # a rank holds 1 / (EP x expert TP) of the routed experts, not 1 / TP
            experts = flops.expert_params(model.llm)
            chain[-1].expert_params = experts / workload.expert_shards
            chain[-1].params += chain[-1].expert_params - experts / tp
        if moe and a2a:
            chain[-1].a2a_bytes, chain[-1].a2a_span = a2a, tp * ep
        if deepstack:  # the merged features of the LLM layers after it that add them
            chain[-1].deepstack_bytes = max(0, deepstack[0] - 1 - i) * deepstack[1]
    add("llm_head", "language_model.output_layer", LLM, flops.llm_head(model.llm, tokens),
        llm_trainable)
    if model.tied_embeddings:
        chain[-1].tied_params = chain[0].params  # the word embedding's weight, TP-split
    return resolve_backward(chain)

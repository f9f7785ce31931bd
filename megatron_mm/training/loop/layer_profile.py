"""Measure forward and backward time of every chain layer on the real model.

Each layer of the planner's chain runs alone on a real micro-batch, in the FP8 context its
module runs in during training, its input detached and requiring a gradient exactly when
the frozen-aware rule says an input gradient flows (``Layer.needs_dgrad``), so the
measured backward is the one training runs: input and weight gradients where they exist,
nothing for a frozen encoder. The result is a ``LayerProfile``
(``megatron_mm.plan.pipeline.profile``), which ``--pipeline-profile`` feeds to the
partitioner in place of the FLOP cost model.
"""

from __future__ import annotations

import platform
import statistics
from typing import Dict, List

import torch

from ...models.fp8_context import get_fp8_context
from ...models.multimodal import MultimodalModel, loss_at_masked_positions
from ...plan.pipeline.layers import Layer
from ...plan.pipeline.profile import LayerProfile, LayerTime
from ...runtime.timer import DeviceTimer
from .activation_profile import parameter_storages, saved_tensor_bytes, tensor_bytes


class _Runner:
    """Runs the model one chain layer at a time, each layer's output becoming the next
    layer's input (detached, so each backward covers one layer)."""

    def __init__(self, model: MultimodalModel, batch: dict):
        self.model, self.batch = model, batch
        self.lm = model.language_model
        self.text = None  # [S, B, H]: embeddings, then LLM hidden states
        self.hidden: Dict[str, torch.Tensor] = {}  # encoder name -> [T, N, H]
        self.rope = model.rotary_embedding(batch["position_ids"])
        self.layout = model.layout(batch["tokens"], batch["media"], batch["loss_mask"])
        model.bind_batches(self.layout)  # a family's host-side batch (Qwen's windows, rope)

    def detach_inputs(self, layer: Layer) -> None:
        """Cut the graph before ``layer``; its inputs need a gradient iff one flows there."""
        def cut(x):
            return x.detach().requires_grad_(layer.needs_dgrad)

        if layer.kind in ("vision_layer", "audio_layer", "projector"):
            self.hidden[layer.branch] = cut(self.hidden[layer.branch])
        if layer.kind in ("projector", "llm_layer", "llm_head"):
            self.text = cut(self.text)

    def inputs(self, layer: Layer) -> List[torch.Tensor]:
        """What a recomputed ``layer`` keeps: its input activations."""
        if layer.kind in ("vision_layer", "audio_layer"):
            return [self.hidden[layer.branch]]
        if layer.kind == "projector":
            return [self.hidden[layer.branch], self.text]
        if layer.kind in ("llm_layer", "llm_head"):
            return [self.text]
        return []  # embeddings: token ids and raw media, kept by the data loader anyway

    def forward(self, layer: Layer) -> torch.Tensor:
        m, b, kind = self.model, self.batch, layer.kind
        index = int(layer.module.rsplit(".", 1)[1]) if kind.endswith("_layer") else None
        if kind == "llm_embed":
            return self.lm.embedding(input_ids=b["tokens"], position_ids=b["position_ids"])
        if kind.endswith("_embed"):
            media = self.layout.encoder_media.get(layer.branch, b["media"])
            return m.encoder(layer.branch).embed(m._items(layer.branch, media))
        if kind in ("vision_layer", "audio_layer"):  # with the family's layer inputs
            encoder, hidden = m.encoder(layer.branch), self.hidden[layer.branch]
            mod = encoder.decoder.layers[index]
            with _fp8(mod):  # never recomputed here: the planner adds recompute itself
                return mod(hidden_states=hidden, **encoder.layer_inputs(hidden))[0]
        if kind == "projector":
            return m.merge(layer.branch, self.text, self.layout, self.hidden[layer.branch])
        if kind == "llm_layer":
            mod = self.lm.decoder.layers[index]
            with _fp8(mod):
                return mod(hidden_states=self.text, attention_mask=None,
                           rotary_pos_emb=self.rope)[0]
        if kind == "llm_head":
            return self._head(self.text)
        raise ValueError(f"no runner for layer kind {kind}")

    def store(self, layer: Layer, out: torch.Tensor) -> None:
        if layer.kind in ("vision_embed", "audio_embed", "vision_layer", "audio_layer"):
            self.hidden[layer.branch] = out.detach()
            kept = getattr(self.model.encoder(layer.branch), "kept", None)
            if kept:  # DeepStack outputs: the projector's backward ends at them too
                kept.update({i: t.detach() for i, t in kept.items()})
        elif layer.kind != "llm_head":
            self.text = out.detach()

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        lm, b = self.lm, self.batch
        weight = (lm.shared_embedding_or_output_weight()
                  if lm.share_embeddings_and_output_weights else None)
        return loss_at_masked_positions(
            hidden_states=lm.decoder.final_layernorm(x), output_layer=lm.output_layer,
            output_weight=weight, labels=b["labels"], loss_mask=b["loss_mask"],
            compute_language_model_loss=lm.compute_language_model_loss,
            scale_logits=lm._scale_logits, context=self.layout.loss_positions)


def _fp8(layer):
    """The FP8 context the layer's block would run it in (a layer run alone bypasses
    TransformerBlock.forward; projectors enter theirs in their own forward)."""
    return get_fp8_context(layer.config, layer.layer_number - 1)


def profile_layers(model: MultimodalModel, chain: List[Layer], batches: List[dict],
                   warmup: int = 1, meta: dict = None) -> LayerProfile:
    """Median forward and backward seconds per chain layer over ``batches`` (after the
    first ``warmup``). ``model`` holds the whole chain (no pipelining)."""
    fwd: Dict[str, List[float]] = {l.module: [] for l in chain}
    bwd: Dict[str, List[float]] = {l.module: [] for l in chain}
    acts: Dict[str, List[float]] = {l.module: [0.0, 0.0] for l in chain}
    params = parameter_storages([model])
    timer = DeviceTimer(next(model.parameters()).device)
    for i, batch in enumerate(batches):
        runner = _Runner(model, batch)
        for layer in chain:
            runner.detach_inputs(layer)
            with torch.set_grad_enabled(layer.runs_backward):
                if i == 0 and layer.runs_backward:  # bytes on the untimed warm-up batch
                    with saved_tensor_bytes(params) as saved:
                        runner.forward(layer)
                    acts[layer.module] = [float(saved.nbytes),
                                          float(tensor_bytes(runner.inputs(layer)))]
                timer.start()
                out = runner.forward(layer)
                t_fwd = timer.stop()
            t_bwd = 0.0
            if layer.runs_backward and out.requires_grad:
                grad = torch.ones_like(out)
                timer.start()
                out.backward(grad)
                t_bwd = timer.stop()
            runner.store(layer, out)
            if i >= warmup:
                fwd[layer.module].append(t_fwd)
                bwd[layer.module].append(t_bwd)
        model.zero_grad(set_to_none=True)
    meta = meta or {}
    return LayerProfile(
        device=f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
        if not torch.cuda.is_available() else torch.cuda.get_device_name(),
        micro_batch_size=batches[0]["tokens"].shape[0],
        seq_length=meta.get("seq_length", batches[0]["tokens"].shape[1]),
        tensor_model_parallel_size=meta.get("tensor_model_parallel_size", 1),
        frozen=meta.get("frozen", []),
        layers=[LayerTime(module=l.module, forward_s=statistics.median(fwd[l.module]),
                          backward_s=statistics.median(bwd[l.module]),
                          act_bytes=acts[l.module][0], recompute_act_bytes=acts[l.module][1])
                for l in chain])

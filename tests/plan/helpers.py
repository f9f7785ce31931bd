"""Hand-built chains for the planner tests (exact integer costs: sums compare exactly)."""

import random

from megatron_mm.plan import Layer, resolve_backward


def layer(kind, i=0, branch=None, fwd=1.0, dgrad=None, wgrad=None, params=0.0, act=0.0,
          trainable=True, recompute=False, out=0.0, recompute_act=None):
    if branch is None:
        branch = "llm" if kind.startswith("llm") else "vision"
    return Layer(kind=kind, module=f"{kind}.{i}", branch=branch, fwd_flops=fwd,
                 dgrad_flops=fwd if dgrad is None else dgrad,
                 wgrad_flops=fwd if wgrad is None else wgrad, params=params, act_bytes=act,
                 recompute_act_bytes=act if recompute_act is None else recompute_act,
                 out_bytes=out, trainable=trainable, recompute=recompute)


def vlm_chain(n_vision, n_llm, freeze_vit=True, freeze_proj=False, freeze_llm=True,
              recompute=False, fwd=1.0):
    """llm_embed, vision_embed, n_vision ViT layers, projector, n_llm layers, llm_head."""
    chain = [layer("llm_embed", trainable=not freeze_llm, fwd=fwd),
             layer("vision_embed", trainable=not freeze_vit, fwd=fwd)]
    chain += [layer("vision_layer", i, trainable=not freeze_vit, recompute=recompute, fwd=fwd)
              for i in range(n_vision)]
    chain.append(layer("projector", trainable=not freeze_proj, fwd=fwd))
    chain += [layer("llm_layer", i, trainable=not freeze_llm, recompute=recompute, fwd=fwd)
              for i in range(n_llm)]
    chain.append(layer("llm_head", trainable=not freeze_llm, fwd=fwd))
    return resolve_backward(chain)


def random_chain(rng: random.Random, n_vision, n_llm):
    """Random integer costs and sizes, random freezing and recompute."""
    freeze_vit, freeze_llm = rng.random() < 0.5, rng.random() < 0.5
    freeze_proj = rng.random() < 0.3

    def rand(kind, i, frozen, branch=None):
        return layer(kind, i, branch=branch, fwd=rng.randint(1, 50), dgrad=rng.randint(1, 50),
                     wgrad=rng.randint(1, 50), params=rng.randint(0, 40),
                     act=rng.randint(0, 30), recompute_act=rng.randint(0, 5),
                     trainable=not frozen, recompute=rng.random() < 0.5)

    chain = [rand("llm_embed", 0, freeze_llm), rand("vision_embed", 0, freeze_vit)]
    chain += [rand("vision_layer", i, freeze_vit) for i in range(n_vision)]
    chain.append(rand("projector", 0, freeze_proj))
    chain += [rand("llm_layer", i, freeze_llm) for i in range(n_llm)]
    chain.append(rand("llm_head", 0, freeze_llm))
    return resolve_backward(chain)

"""The training plan a run makes of its flags, before any process group (with the real
vocabulary), and layer profiles written for it."""

def tokenizer():
    """The demo's tokenizer (its real vocabulary sizes the plan's embedding layers)."""
    from megatron_mm.data import build_tokenizer

    return build_tokenizer("MistralV1SentencePiece", None)


def plan_of(argv, world):
    """The RunConfig of the flags and the training plan a run makes of them (with the real
    vocabulary)."""
    from megatron_mm.training.planning.training_plan import plan_pipeline
    from megatron_mm.training.cli.arguments import parse_run_config
    from megatron_mm.training.loop.trainer import model_config_for

    config = parse_run_config(argv, world_size=world)
    return config, plan_pipeline(config, model_config_for(config, tokenizer()))


def slow_link_profile(argv, world, path, slow=True, vit=20):
    """A layer profile of this model (a ViT layer ``vit`` x an LLM layer's time) whose TP
    links are slow and latency-bound (``slow``, gloo-like: 1 ms per all-reduce; else the
    defaults), written to ``path``: the ViT's TP all-reduces then outweigh what a higher
    encoder TP saves."""
    from megatron_mm.plan.costs.hardware import Interconnect
    from megatron_mm.plan.pipeline.profile import LayerProfile, LayerTime

    config, plan = plan_of(argv, world)
    vision = lambda l: "vision" in l.module  # noqa: E731
    LayerProfile("test", config.training.micro_batch_size, config.model.seq_length, 1, [], [
        LayerTime(l.module, vit * 1e-3 if vision(l) else 1e-3,
                  2 * vit * 1e-3 if vision(l) else 2e-3)
        for l in plan.chain],
        tp_links=Interconnect(tp_bandwidth=1e9, tp_latency_s=1e-3) if slow else None
    ).save(str(path))
    return str(path)


def separate_profile(argv, world, path, vit, head):
    """A layer profile of this model written to ``path``: each ViT layer ``vit`` ms
    forward, the LLM's output layer ``head`` ms, every other layer 1 ms (backward twice the
    forward where one runs). A frozen ViT at 20 / 10 ms: ``--encoder-schedule auto`` picks
    the separate placement on 2 ranks (test_encoder_schedule_auto)."""
    from megatron_mm.plan.pipeline.profile import LayerProfile, LayerTime

    config, plan = plan_of(argv, world)
    ms = lambda l: vit if l.kind == "vision_layer" else head if l.kind == "llm_head" else 1  # noqa: E731
    LayerProfile("test", config.training.micro_batch_size, config.model.seq_length, 1, [], [
        LayerTime(l.module, ms(l) * 1e-3, 2 * ms(l) * 1e-3 if l.runs_backward else 0.0)
        for l in plan.chain]).save(str(path))
    return str(path)

"""--freeze-ViT / --freeze-LM / --freeze-projector: frozen parameters stay bit-identical,
are not in the optimizer, get no gradient, and a frozen encoder runs no backward."""

import pytest
import torch
from dist_harness import run_distributed
from train_workers import TINY_MODEL, full_state, train

MODULES = ("vision_model", "vision_projection", "language_model")


def watch(chunks, optimizer, holder):
    """Snapshot the weights, list optimizer params, count forward and backward calls."""
    holder["init"] = full_state(chunks, grads=False)
    (model,) = chunks
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    holder["in_optimizer"] = {n: id(p) in in_optimizer for n, p in model.named_parameters()}
    counts = holder["counts"] = {f"{m}.{k}": 0 for m in MODULES for k in ("fwd", "bwd")}

    def bump(key):
        def hook(*_):
            counts[key] += 1
        return hook

    for name in MODULES:
        # the ViT's transformer layers (its parts run one by one, not through forward())
        module = model.get_submodule("vision_model.decoder" if name == "vision_model" else name)
        module.register_forward_hook(bump(f"{name}.fwd"))
        module.register_full_backward_hook(bump(f"{name}.bwd"))


def _run(digits_dir, *freeze):
    argv = TINY_MODEL + ["--data-path", digits_dir, "--train-iters", "2",
                         "--micro-batch-size", "4", *freeze]
    return run_distributed(train, 1, argv, (2,), watch)[0]


def _frozen(name, frozen_modules):
    return name.split(".")[0] in frozen_modules


@pytest.mark.processes
@pytest.mark.parametrize("flags, frozen", [
    (["--freeze-ViT"], {"vision_model"}),
    (["--freeze-LM", "--freeze-projector"], {"language_model", "vision_projection"}),
])
def test_freezing(digits_dir, flags, frozen):
    out = _run(digits_dir, *flags)
    seen = out["observed"]
    for name, init in seen["init"].items():
        after, grad = out["params"][name], out["grads"][2][name]
        if _frozen(name, frozen):
            assert torch.equal(after, init), f"frozen {name} changed"
            assert not seen["in_optimizer"][name], f"frozen {name} is in the optimizer"
            assert grad is None, f"frozen {name} has a gradient buffer"
        else:
            assert not torch.equal(after, init), f"trainable {name} did not change"
            assert seen["in_optimizer"][name], f"trainable {name} not in the optimizer"
    counts = seen["counts"]
    assert all(counts[f"{m}.fwd"] > 0 for m in MODULES), counts
    if "vision_model" in frozen:
        # Nothing trainable upstream of a frozen encoder: autograd never enters it.
        assert counts["vision_model.bwd"] == 0, counts
    else:
        # A trainable encoder's backward runs, through the frozen LLM and projector.
        assert counts["vision_model.bwd"] > 0, counts
        assert counts["language_model.bwd"] > 0, counts


def test_freezing_everything_is_refused(capsys):
    from megatron_mm.training.cli.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--freeze-LM", "--freeze-ViT", "--freeze-projector"], world_size=1)
    assert "nothing would train" in capsys.readouterr().err

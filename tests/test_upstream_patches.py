"""``patches/``: every upstream bug megatron_mm works around at run time has a patch file
that ``git apply`` applies to the installed Megatron-Core, and its reproduction
(``patches/reproductions.py``, a fresh interpreter with the copy first on the path, none of
megatron_mm's runtime patches) passes on the patched copy and fails on the installed
tree."""

import importlib
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCHES = os.path.join(ROOT, "patches")
# runtime workaround (a registry patch, or the module holding it) -> (its patch file,
# the reproduction)
UPSTREAM_BUGS = {
    "triton_stub": ("0001-moe-paged-stash-import-without-triton.patch",
                    "moe_paged_stash_import"),
    "destroy_resets_embedding_ranks": ("0002-destroy-model-parallel-resets-embedding-ranks.patch",
                                       "destroy_resets_embedding_ranks"),
    "clip_vit_norm": ("0003-clip-vit-norm-without-te.patch", "clip_vit_norm_without_te"),
    "distopt_load": ("0004-distributed-optimizer-load-with-torch-adam.patch",
                     "distopt_load_with_torch_adam"),
    "megatron_mm.models.moe_router": ("0005-moe-router-local-token-count-before-all-reduce.patch",
                                      "moe_local_token_count"),
    "checkpoint_object_args": ("0006-checkpoint-function-non-tensor-arguments.patch",
                               "recompute_non_tensor_arguments"),
    "help_percent": ("0008-argument-help-escapes-percent.patch", "argument_help_percent"),
    "tp_partial_grads": ("0007-gdn-out-norm-grads-summed-over-tp-without-sequence-parallel.patch",
                         "gdn_out_norm_tp_grads"),
    "defer_wgrad_local_linears": ("0009-defer-embedding-wgrad-compute-local-linears-without-buffer"
                                  ".patch", "defer_wgrad_local_linears"),
}
# upstream bugs in code megatron_mm does not call (no runtime workaround) -> (patch, reproduction)
NOT_CALLED = {
    "megatron.core.tensor_parallel.broadcast_data": ("0010-broadcast-data-sizes-over-its-tp-group"
                                                     ".patch", "broadcast_data_tp_group"),
}


def _installed_megatron() -> str:
    spec = importlib.util.find_spec("megatron.core")  # not imported: a spec only
    return os.path.dirname(os.path.dirname(spec.origin))


def _reproductions(megatron_parent: str) -> dict:
    """``reproductions.py`` in a fresh interpreter, ``megatron_parent``'s megatron first."""
    env = dict(os.environ, PYTHONPATH=megatron_parent, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.join(PATCHES, "reproductions.py")],
                         capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-3000:]
    return json.loads(lines[-1])


def test_every_runtime_workaround_of_an_upstream_bug_has_its_patch_file():
    from megatron_mm.runtime_patches import PATCHES as RUNTIME

    names = {p.name for p in RUNTIME}
    for workaround, (patch, _) in {**UPSTREAM_BUGS, **NOT_CALLED}.items():
        assert (workaround in names or workaround in NOT_CALLED
                or importlib.util.find_spec(workaround)), workaround
        assert os.path.isfile(os.path.join(PATCHES, patch)), f"{patch} is missing"
        with open(os.path.join(PATCHES, patch)) as f:
            assert f.readline().startswith("Subject: [PATCH] "), patch  # its one line
        with open(os.path.join(PATCHES, "README.md")) as f:
            assert patch in f.read(), f"README.md does not list {patch}"
    files = sorted(f for f in os.listdir(PATCHES) if f.endswith(".patch"))
    assert files == sorted(p for p, _ in (*UPSTREAM_BUGS.values(), *NOT_CALLED.values()))


@pytest.mark.processes
def test_patches_apply_to_megatron_core_and_fix_their_reproductions(tmp_path):
    installed = _installed_megatron()  # .../site-packages/megatron
    copy = tmp_path / "megatron"
    # megatron/core and Megatron-LM's megatron/training only (megatron is a namespace
    # package: the rest stays installed); the bytecode too, valid for the files no patch
    # changes
    for part in ("core", "training"):
        shutil.copytree(os.path.join(installed, part), copy / part)
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    for patch, _ in sorted((*UPSTREAM_BUGS.values(), *NOT_CALLED.values())):
        done = subprocess.run(["git", "apply", os.path.join(PATCHES, patch)], cwd=tmp_path,
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0, f"{patch} no longer applies: {done.stderr}"
    patched = _reproductions(str(tmp_path))
    assert patched["megatron"] == str(copy)
    wanted = {repro for _, repro in (*UPSTREAM_BUGS.values(), *NOT_CALLED.values())}
    assert set(patched["results"]) == wanted
    assert all(r == "ok" for r in patched["results"].values()), patched["results"]
    # the installed tree: each reproduction shows its bug
    unpatched = _reproductions("")
    assert unpatched["megatron"] == installed
    assert all(r.startswith("FAILED") for r in unpatched["results"].values()), unpatched

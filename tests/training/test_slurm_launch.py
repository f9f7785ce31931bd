"""examples/slurm/pretrain_mllm.sbatch in dry-run mode: the command it would launch on
each node is torchrun with a c10d rendezvous on the first node, and training flags the
script's own parser accepts, resuming from and saving to the checkpoint directory."""

import os
import shlex
import subprocess

import pytest

from megatron_mm.training.cli.arguments import parse_args

pytestmark = pytest.mark.processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(ROOT, "examples", "slurm", "pretrain_mllm.sbatch")


def _flags(tokens):
    """--name value pairs (and bare --switches) of a torchrun argument list."""
    out, i = {}, 0
    while i < len(tokens):
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[tokens[i]] = tokens[i + 1]
            i += 2
        else:
            out[tokens[i]] = True
            i += 1
    return out


def test_dry_run_prints_a_torchrun_command_the_parser_accepts(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    env.update(DRY_RUN="1", SLURM_NNODES="4", SLURM_JOB_ID="4242", GPUS_PER_NODE="8",
               MASTER_ADDR="node001", CKPT_DIR=str(tmp_path / "ckpt"), REPO=ROOT)
    out = subprocess.run(["bash", SBATCH], capture_output=True, text=True, env=env,
                         timeout=60, check=True)
    command = shlex.split(out.stdout)
    assert command[:2] == ["srun", "--kill-on-bad-exit=1"]
    run = command.index("torch.distributed.run")
    script = next(i for i, t in enumerate(command) if t.endswith("pretrain_mllm.py"))
    assert command[script] == os.path.join(ROOT, "examples", "pretrain_mllm.py")
    torchrun = _flags(command[run + 1:script])
    assert torchrun["--nnodes"] == "4" and torchrun["--nproc-per-node"] == "8"
    assert torchrun["--rdzv-backend"] == "c10d"
    assert torchrun["--rdzv-endpoint"] == "node001:29500"
    assert torchrun["--rdzv-id"] == "4242"
    assert int(torchrun["--shutdown-timeout"]) < 120  # saves before Slurm's SIGKILL
    args = parse_args(command[script + 1:], world_size=4 * 8)
    assert args.load == args.save == str(tmp_path / "ckpt")  # resume on requeue
    assert args.exit_signal_handler and args.exit_duration_in_mins
    assert args.data_parallel_size == 32 // (args.tensor_model_parallel_size
                                              * args.pipeline_model_parallel_size)
    assert not os.path.exists(tmp_path / "ckpt")  # a dry run creates nothing

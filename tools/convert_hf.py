"""Convert Hugging Face checkpoints to megatron_mm distributed checkpoints and back.

    python tools/convert_hf.py import --hf-dir llava-1.5-7b-hf --save ckpts/llava \\
        --tensor-model-parallel-size 4
    torchrun ... examples/pretrain_mllm.py --load ckpts/llava --save ckpts/llava ...
    python tools/convert_hf.py export --load ckpts/llava --hf-dir llava-finetuned-hf
    python tools/convert_hf.py export --load ckpts/llava-lora --hf-dir adapter --lora-adapter
    python tools/convert_hf.py compare --hf-dir llava-1.5-7b-hf --load ckpts/llava \\
        --inputs inputs.pt --tensor-model-parallel-size 2

Import writes iteration 0 (weights only) with the model's flags, tokenizer and image
processor, so ``--load`` needs no architecture flags and loads at any TP / PP.
``--tensor-model-parallel-size`` on import is the largest TP it will be loaded at (the
vocabulary is padded for it). Compare runs the Hugging Face model and the checkpoint (at
the TP / PP given, in the processes those need, started by itself) on the keyword
arguments of the Hugging Face forward saved with ``torch.save`` in ``--inputs`` (e.g.
``{"input_ids": ..., "pixel_values": ...}``), in fp32, and prints ``max abs logit
difference: X`` last. Supported architectures: see ``--help``.
"""

import argparse
import sys

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()  # before any megatron.core import (megatron_mm.hf imports models)

from megatron_mm.hf import ARCHITECTURES, ConversionError  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                epilog="supported: " + ", ".join(sorted(ARCHITECTURES)))
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face directory -> megatron_mm checkpoint")
    imp.add_argument("--hf-dir", required=True)
    imp.add_argument("--save", required=True)
    imp.add_argument("--tensor-model-parallel-size", type=int, default=1)
    imp.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    exp = sub.add_parser("export", help="megatron_mm checkpoint -> Hugging Face directory")
    exp.add_argument("--load", required=True)
    exp.add_argument("--hf-dir", required=True)
    lora = exp.add_mutually_exclusive_group()
    lora.add_argument("--lora-adapter", action="store_true",
                      help="a LoRA checkpoint as a PEFT adapter (adapter_config.json, "
                           "adapter_model.safetensors) for the model it was imported from")
    lora.add_argument("--merge-lora", action="store_true",
                      help="a LoRA checkpoint as the Hugging Face model, adapters merged")
    cmp = sub.add_parser("compare", help="max |logit difference| of a checkpoint and its "
                                         "Hugging Face model on given inputs")
    cmp.add_argument("--hf-dir", required=True)
    cmp.add_argument("--load", required=True)
    cmp.add_argument("--inputs", required=True,
                     help="torch.save'd dict of the Hugging Face forward's keyword arguments")
    cmp.add_argument("--tensor-model-parallel-size", type=int, default=1)
    cmp.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    cmp.add_argument("--expert-model-parallel-size", type=int, default=1,
                     help="an MoE LLM's experts split over this many ranks (TP x PP x EP "
                          "x CP processes in all)")
    cmp.add_argument("--context-parallel-size", type=int, default=1,
                     help="each sequence split over this many ranks by the training "
                          "script's causal CP split")
    cmp.add_argument("--context-parallel-block", type=int, default=None,
                     help="tokens per CP block (default: the checkpoint's); a sequence of "
                          "fewer blocks than ranks runs whole on every rank")
    args = p.parse_args(argv)
    if args.command == "compare":
        return _compare(args)

    from megatron_mm.hf.convert import export_hf, import_hf
    from megatron_mm.hf.world import single_rank_world
    from megatron_mm.training.errors import USER_ERRORS

    try:
        with single_rank_world():
            if args.command == "import":
                out = import_hf(args.hf_dir, args.save, args.tensor_model_parallel_size,
                                args.make_vocab_size_divisible_by)
            else:
                out = export_hf(args.load, args.hf_dir, "adapter" if args.lora_adapter
                                else "merge" if args.merge_lora else None)
    except (ConversionError, *USER_ERRORS) as e:
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"wrote {out}")
    return 0


def _compare(args) -> int:
    import torch
    from megatron_mm.hf.compare import RANK_PRELOAD, compare
    from megatron_mm.training.errors import USER_ERRORS

    try:
        try:
            inputs = torch.load(args.inputs, weights_only=True)
        except Exception as e:
            raise ConversionError(f"--inputs {args.inputs}: not a torch.save'd dict of "
                                  f"tensors ({e.__class__.__name__})") from None
        torch.multiprocessing.set_forkserver_preload(RANK_PRELOAD)
        diff, shape = compare(args.hf_dir, args.load, inputs,
                              args.tensor_model_parallel_size,
                              args.pipeline_model_parallel_size,
                              args.expert_model_parallel_size, args.context_parallel_size,
                              args.context_parallel_block)
    except (ConversionError, *USER_ERRORS) as e:
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"logits {list(shape)}, TP={args.tensor_model_parallel_size} "
          f"PP={args.pipeline_model_parallel_size} EP={args.expert_model_parallel_size} "
          f"CP={args.context_parallel_size}")
    print(f"max abs logit difference: {diff:.6g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pretrain a vision (and/or audio) language model with Megatron-LM's own training loop:
Megatron-LM's ``pretrain_vlm.py`` with the package's encoders, projectors, data and
forward step around the user's own GPT (here ``pretrain_gpt.py``'s, from the
Megatron-LM flags: any norm, activation, biases, MoE, TE or local spec).

    TOK=$(python -c "import megatron_mm.data.tokenizer as t;print(t.default_tokenizer_model())")
    torchrun --nproc-per-node 2 examples/megatron_lm/pretrain_vlm.py \\
        --tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 \\
        --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \\
        --micro-batch-size 2 --global-batch-size 4 --train-iters 20 --lr 1e-3 \\
        --eval-interval 10 --eval-iters 2 --transformer-impl local \\
        --dataloader-type external --calculate-per-token-loss \\
        --tokenizer-type SentencePieceTokenizer --tokenizer-model "$TOK" \\
        --vision-num-layers 2 --vision-hidden-size 32 --vision-num-attention-heads 2 \\
        --img-h 16 --img-w 16 --patch-dim 4

On a CPU as written (prepare_megatron_core() sets Megatron-LM's GPU-only defaults to what a
CPU runs; --transformer-impl local: without Transformer Engine); the built-in digits data
(--data-path for your own) with Megatron-LM's default GPT positions (learned_absolute).

docs/megatron_lm.md: what changes against Megatron-LM's pretrain_vlm.py, step by step.
"""

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()  # first: TE checked, CPU patches applied (none on a GPU with TE)

from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_decoder_block_spec, get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec)
from megatron.training import get_args, pretrain  # noqa: E402
from megatron.training.argument_utils import pretrain_cfg_container_from_args  # noqa: E402
from megatron.training.arguments import (  # noqa: E402
    core_transformer_config_from_args, parse_and_validate_args)

from megatron_mm import megatron_lm as mm  # noqa: E402


def language_model_provider(pre_process=True, post_process=True, vp_stage=None, config=None,
                            pg_collection=None) -> GPTModel:
    """The user's GPT, as Megatron-LM's pretrain_gpt.py builds it from the flags."""
    args = get_args()
    config = config or core_transformer_config_from_args(args)
    use_te = args.transformer_impl == "transformer_engine"
    if args.num_experts:
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=use_te, normalization=args.normalization,
            vp_stage=vp_stage)
    elif use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=args.qk_layernorm)
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm,
                                        normalization=args.normalization)
    return GPTModel(
        config=config, transformer_layer_spec=mm.language_layer_spec(spec),
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
        post_process=post_process, parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent, rotary_base=args.rotary_base,
        vp_stage=vp_stage, pg_collection=pg_collection)


def main() -> None:
    args = parse_and_validate_args(extra_args_provider=mm.add_args)
    mm.check_args(args)  # the package's flags: a bad one exits with one line from rank 0
    # --encoder-schedule coarse | bubble: the encoders' work in the LLM's pipeline bubbles,
    # through Megatron-LM's own train_step and evaluate (megatron: Megatron-Core's schedule)
    with mm.use_encoder_schedule():
        pretrain(pretrain_cfg_container_from_args(args), mm.train_valid_test_datasets_provider,
                 ModelType.encoder_or_decoder, mm.forward_step,
                 mm.model_provider_for(language_model_provider))


if __name__ == "__main__":  # required: checkpoint saving spawns helper processes
    main()

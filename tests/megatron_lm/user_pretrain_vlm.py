"""A user's own Megatron-LM script (a test fixture, not the package's example), written
from Megatron-LM's ``pretrain_vlm.py`` and docs/megatron_lm.md alone: ``pretrain_vlm.py``'s
model provider, extra flags and ``pretrain`` call, its ``LLaVAModel`` replaced by a plain
GPT (Megatron-LM's defaults: LayerNorm, GELU, biases, learned absolute positions) wrapped
by the package. ``main``'s keywords leave out one step of the docs each (the tests of the
errors that name it)."""

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()

from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.training import get_args, pretrain, print_rank_0  # noqa: E402
from megatron.training.argument_utils import pretrain_cfg_container_from_args  # noqa: E402
from megatron.training.arguments import (  # noqa: E402
    core_transformer_config_from_args, parse_and_validate_args)

from megatron_mm import megatron_lm as mm  # noqa: E402

WRAP_SPEC = True  # main(wrap_spec=False): the spec not passed through mm.language_layer_spec


def model_provider(pre_process=True, post_process=True, vp_stage=None) -> GPTModel:
    """Builds the model (pretrain_vlm.py's builds LLaVAModel: here its language model)."""
    args = get_args()
    print_rank_0('building a multimodal model ...')
    language_transformer_config = core_transformer_config_from_args(args)
    language_layer_spec = get_gpt_layer_local_spec(normalization=args.normalization)
    if WRAP_SPEC:
        language_layer_spec = mm.language_layer_spec(language_layer_spec)
    return GPTModel(
        config=language_transformer_config, transformer_layer_spec=language_layer_spec,
        vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process, post_process=post_process, parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, vp_stage=vp_stage)


def add_vlm_extra_args(parser):
    """Extra arguments (pretrain_vlm.py's)."""
    group = parser.add_argument_group(title='vision language model specific arguments')
    group.add_argument('--freeze-LM', action='store_true', default=False,
                       help="Freeze language model weights")
    group.add_argument('--freeze-ViT', action='store_true', default=False,
                       help="Freeze vision model (ViT) weights")
    group.add_argument("--disable-vision-class-token", action="store_true", default=False,
                       help="Drop vision model class token")
    return parser


def main(hook: bool = True, wrap_spec: bool = True) -> None:
    global WRAP_SPEC
    WRAP_SPEC = wrap_spec
    args = parse_and_validate_args(
        extra_args_provider=lambda parser: mm.add_args(add_vlm_extra_args(parser)))
    mm.check_args(args)
    run = lambda: pretrain(  # noqa: E731
        pretrain_cfg_container_from_args(args), mm.train_valid_test_datasets_provider,
        ModelType.encoder_or_decoder, mm.forward_step, mm.model_provider_for(model_provider))
    if not hook:
        return run()
    with mm.use_encoder_schedule():
        run()


if __name__ == "__main__":
    main()

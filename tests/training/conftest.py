import pytest


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """The built-in digits data, written once for every training test."""
    from megatron_mm.data.digits import prepare_digits

    out = tmp_path_factory.mktemp("digits")
    prepare_digits(out)
    return str(out)


@pytest.fixture(scope="session")
def audio_digits_dir(tmp_path_factory):
    """Images and tones of different lengths, for the two-encoder training tests."""
    from audio_data import write_audio_digits

    return write_audio_digits(str(tmp_path_factory.mktemp("audio_digits")))


@pytest.fixture(scope="session")
def internvl_digits_dir(tmp_path_factory):
    """Digit images of four aspect ratios (1, 3, 4, 5 tiles), one or two per record."""
    from internvl_data import write_internvl_digits

    return write_internvl_digits(str(tmp_path_factory.mktemp("internvl_digits")))


@pytest.fixture(scope="session")
def one_process_reference(tmp_path_factory):
    """``one_process_reference(data_dir, model_flags)`` -> ``(argv, result)``: an initial
    checkpoint and the one-process run of ``REFERENCE_STEPS`` steps from it, made once per
    data and model for the whole session; the parallel runs load the same checkpoint (stages
    draw different random streams). Shared by the pipeline, audio and sequence-parallel
    equivalence tests."""
    from dist_harness import run_distributed
    from equivalence import REFERENCE_STEPS
    from train_workers import TINY_MODEL, train

    made = {}

    def reference(data_dir, model=()):
        key = (data_dir, tuple(model))
        if key not in made:
            init = str(tmp_path_factory.mktemp("init"))
            common = TINY_MODEL + ["--data-path", data_dir, "--micro-batch-size", "2",
                                   "--global-batch-size", "8", *model]
            run_distributed(train, 1, common + ["--train-iters", "0", "--save", init])
            argv = common + ["--train-iters", str(REFERENCE_STEPS), "--load", init,
                             "--no-load-optim"]
            made[key] = argv, run_distributed(train, 1, argv, (1, REFERENCE_STEPS))[0]
        return made[key]
    return reference

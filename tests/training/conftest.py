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

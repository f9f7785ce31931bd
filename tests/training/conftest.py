import pytest


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """The built-in digits data, written once for every training test."""
    from megatron_mm.data.digits import prepare_digits

    out = tmp_path_factory.mktemp("digits")
    prepare_digits(out)
    return str(out)

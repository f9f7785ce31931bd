import pytest


@pytest.fixture(scope="session")
def internvl_digits_dir(tmp_path_factory):
    """Digit images of four aspect ratios (1, 3, 4, 5 tiles), one or two per record."""
    from internvl_data import write_internvl_digits

    return write_internvl_digits(str(tmp_path_factory.mktemp("internvl_digits")))

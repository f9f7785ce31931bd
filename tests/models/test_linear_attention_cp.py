"""The Gated DeltaNet layer at CP=2 under the package's token assignment equals one rank
(``tests/gdn_cp_check.py``): outputs and gradients, local and TE specs, unequal token
counts per rank, packed samples, and a micro-batch every rank holds whole."""

import pytest
from dist_harness import run_distributed
from gdn_cp_check import assert_gdn_cp_errors, check_gdn_cp


@pytest.mark.processes
def test_gdn_context_parallel_equals_one_rank():
    assert_gdn_cp_errors(run_distributed(check_gdn_cp, 2))

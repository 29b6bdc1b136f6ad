"""Every Hypothesis use in ``tests/`` is derandomized: a test either always passes or always fails.

The profile is loaded when this file is imported, before pytest imports the test modules, so the
module-level ``settings(...)`` objects the tests build (``FAST``, ``FIND``, ...) inherit it. It
changes nothing for attnverify itself: ``certify``, ``falsify``, ``claims`` and the property suite
(``properties/``) build their settings with every relevant option given (``derandomize=False``,
``database=None``, ``deadline=None``) and seed each run with ``hypothesis.seed(ctx.seed)``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# certify runs serially in the tests (pytest -n 2 already takes the cores); a test of --jobs
# says --jobs N
os.environ.setdefault("ATTNVERIFY_JOBS", "1")

TEST_PROFILE = "attnverify-tests"

settings.register_profile(
    TEST_PROFILE,
    derandomize=True,  # the seed comes from the test itself, so every run draws the same examples
    database=None,  # no example replayed from an earlier run (or an earlier checkout)
    deadline=None,  # timing on a shared 2-core machine is not a property of the code
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(TEST_PROFILE)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _draws_independent_of_loaded_modules(request):
    """Every test draws with Hypothesis's pool of constants from loaded local modules empty
    (attnverify.runconfig.seeded_generation, as certify's and falsify's searches do): a test's
    examples then depend on its seed and strategy alone, not on which fixture modules earlier
    tests in the same process happened to load (a `find` that met its example alone once missed
    it after test_isolation had loaded tests/fixtures/*.py)."""
    from attnverify.runconfig import seeded_generation

    if request.node.get_closest_marker("local_constants"):  # a test of that pool itself
        yield
        return
    with seeded_generation():
        yield


@pytest.fixture(autouse=True)
def _global_generators_seeded_per_test():
    """torch's, numpy's and ``random``'s global generators start every test from the same state,
    so an unseeded ``torch.randn`` in a test draws the same tensor whichever tests ran before it
    in the same xdist worker (a test once drew, about one run in thirty, a row whose variance
    was small enough for the normaliser's epsilon to matter)."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield

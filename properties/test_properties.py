"""The attnverify property suite: every universal property and every claim of each target.

Run it against the built-ins (``pytest properties``) or any normalizer
(``pytest properties --attnverify-target=pkg.mod:fn``); see the README's CI recipe.
"""

from attnverify.suite import pytest_generate_tests, test_property  # noqa: F401

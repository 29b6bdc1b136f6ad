"""pytest plugin (entry point ``pytest11``): run the property suite against a user's normalizer."""

from __future__ import annotations

import os


def pytest_addoption(parser):
    group = parser.getgroup("attnverify")
    group.addoption(
        "--attnverify-target",
        default=os.environ.get("ATTNVERIFY_TARGET"),
        help="normalizer under test (built-in id, module:attr or file.py:attr); "
        "env ATTNVERIFY_TARGET",
    )

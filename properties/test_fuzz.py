"""The entry of long campaigns on HypoFuzz (:mod:`attnverify.fuzz`): one Hypothesis test per unit
(target × property × dtype) of ``certify``'s work on the target that ``ATTNVERIFY_FUZZ_TARGET``
names, filed in the database that ``ATTNVERIFY_FUZZ_DATABASE`` names under the keys
``certify --database`` replays::

    ATTNVERIFY_FUZZ_TARGET=pkg.mod:fn ATTNVERIFY_FUZZ_DATABASE=fuzz-db \\
        hypothesis fuzz -- properties/test_fuzz.py

Without ``ATTNVERIFY_FUZZ_TARGET`` it holds one test, skipped with the reason (the default
``pytest`` run does no work here). With it, plain ``pytest`` runs each test once under the
profile's budget, replaying the database first.
"""

from attnverify.fuzz import entry_tests

globals().update(entry_tests())

"""The coverage block counts a case alike on both of its paths: small cases in Python floats,
larger ones in numpy (attnverify.coverage.SMALL)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from attnverify import coverage as CV
from attnverify.checks.cases import RowCase
from attnverify.coverage import Coverage

NINF = -math.inf


def _block(case, *, small: bool, monkeypatch) -> dict:
    monkeypatch.setattr(CV, "SMALL", 10**9 if small else 0)
    cov = Coverage()
    cov.add(case)
    return cov.to_json()


def test_a_hand_counted_case_on_both_paths(monkeypatch):
    rows = torch.tensor([[NINF, 3.0, -50.0, math.nan],   # a masked key; largest |z|: -50
                         [NINF, NINF, NINF, NINF],       # fully masked
                         [0.0, -0.0, 0.0, 0.0],          # a zero row: no magnitude
                         [-2e4, -3e4, math.inf, NINF],   # far below zero; largest |z|: -3e4
                         [1000.0, 999.0, 0.5, 1.0]],     # exactly a power of ten: decade 3
                        dtype=torch.float64)
    for small in (True, False):
        block = _block(RowCase(rows, 0.5, "masked", 0), small=small, monkeypatch=monkeypatch)
        assert block["masked_keys"] == 1 and block["fully_masked_rows"] == 1
        assert block["values"] == [-3e4, 1000.0]
        assert math.copysign(1.0, block["values"][1]) == 1.0
        assert block["far_below"] == 1
        assert block["magnitudes"] == [50.0, 3e4]
        assert block["decades"] == {"float64": {"+": [[3, 3]], "-": [[1, 1], [4, 4]]}}


def test_zero_rows_give_a_positive_zero_value(monkeypatch):
    rows = torch.tensor([[-0.0, -0.0], [0.0, -0.0]])
    for small in (True, False):
        block = _block(RowCase(rows, None, "gaussian", 0), small=small, monkeypatch=monkeypatch)
        assert [math.copysign(1.0, v) for v in block["values"]] == [1.0, 1.0]
        assert block["magnitudes"] is None and block["decades"] == {}


def _random_case(rng: random.Random, g: torch.Generator) -> RowCase:
    rows, length = rng.choice([1, 2, 3, 4, 7, 33]), rng.choice([1, 2, 3, 5, 16, 31, 64, 200])
    dtype = rng.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16])
    top = 300 if dtype == torch.float64 else 4
    x = torch.randn(rows, length, generator=g, dtype=torch.float64) * 10 ** rng.uniform(-top, top)
    if rng.random() < 0.3:
        x = x.round()
    if rng.random() < 0.2:
        x[:, :1] = 10.0 ** rng.randint(-4, 4)  # exactly a power of ten (in float64)
    for value, share in ((NINF, 0.3), (math.inf, 0.1), (math.nan, 0.1)):
        if rng.random() < 0.3:
            x[torch.rand(rows, length, generator=g) < share] = value
    if rng.random() < 0.1:
        x[0] = NINF
    return RowCase(x.to(dtype), 0.5, "gaussian", 0)


@pytest.mark.parametrize("seed", range(4))
def test_both_paths_count_random_cases_alike(seed, monkeypatch):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    for _ in range(150):
        case = _random_case(rng, g)
        assert _block(case, small=True, monkeypatch=monkeypatch) == \
            _block(case, small=False, monkeypatch=monkeypatch), case.scores


def test_decades_in_numpy_match_decade_at_powers_of_ten():
    import numpy as np

    values = [10.0 ** e for e in range(-300, 301)] + [math.nextafter(10.0 ** e, 0)
                                                         for e in range(-300, 301)]
    values += [5e-324, 2.2e-308, 1.7976931348623157e308, 0.001, 999.9999999999999]
    assert CV._decades(np.array(values)) == {CV._decade(v) for v in values}

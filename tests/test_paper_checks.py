"""The ratio the paper checks report: observed ÷ allowed, never blown up by a bound of 0."""

import torch

from attnverify.checks import paper


def test_upper_ratio_of_zero_bound_met_within_slack_is_small():
    ratio = paper._upper(torch.tensor([1e-17]), torch.tensor([0.0]), "d̃")
    assert 0.0 <= ratio < 1e-3


def test_upper_ratio_is_exact_for_a_tight_bound():
    assert paper._upper(torch.tensor([0.5]), torch.tensor([0.5]), "x") == 1.0
    assert paper._upper(torch.tensor([0.25]), torch.tensor([0.5]), "x") == 0.5


def test_lower_ratio_of_zero_observation_within_slack_is_small():
    ratio = paper._lower(torch.tensor([0.0]), torch.tensor([1e-17]), "E")
    assert 0.0 <= ratio < 1e-3

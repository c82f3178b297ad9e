import math

import torch

from hyflow.algorithms import masked_mean, masked_sum, masked_var, masked_whiten


def _valid_values(values, mask):
    return [v for v, m in zip(values.flatten().tolist(), mask.flatten().tolist()) if m]


def test_masked_mean_and_sum_match_a_loop_over_the_valid_elements():
    torch.manual_seed(0)
    values, mask = torch.randn(3, 5), (torch.rand(3, 5) > 0.4).float()
    valid = _valid_values(values, mask)
    assert math.isclose(masked_sum(values, mask).item(), sum(valid), rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(masked_mean(values, mask).item(), sum(valid) / len(valid), rel_tol=1e-5, abs_tol=1e-6)
    row_means = masked_mean(values, mask, axis=-1)
    for row in range(3):
        row_valid = _valid_values(values[row], mask[row])
        expected = sum(row_valid) / len(row_valid) if row_valid else 0.0
        assert math.isclose(row_means[row].item(), expected, rel_tol=1e-5, abs_tol=1e-6)


def test_masked_var_is_the_unbiased_variance_of_the_valid_elements():
    torch.manual_seed(1)
    values, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.3).float()
    valid = _valid_values(values, mask)
    mean = sum(valid) / len(valid)
    expected = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    assert math.isclose(masked_var(values, mask).item(), expected, rel_tol=1e-5)


def test_masked_whiten_gives_zero_mean_unit_variance_on_valid_elements():
    torch.manual_seed(2)
    values, mask = 3 + 2 * torch.randn(4, 6), (torch.rand(4, 6) > 0.3).float()
    whitened = masked_whiten(values, mask)
    assert abs(masked_mean(whitened, mask).item()) < 1e-5
    assert math.isclose(masked_var(whitened, mask).item(), 1.0, rel_tol=1e-4)
    unshifted = masked_whiten(values, mask, shift_mean=False)
    assert math.isclose(masked_mean(unshifted, mask).item(), masked_mean(values, mask).item(), rel_tol=1e-5)


def test_masked_statistics_of_an_empty_mask_are_zero_not_nan():
    values, mask = torch.randn(2, 3), torch.zeros(2, 3)
    assert masked_mean(values, mask).item() == 0.0
    assert masked_var(values, mask).item() == 0.0
    single = torch.tensor([[0.0, 1.0, 0.0]])
    assert masked_var(values[:1], single).item() == 0.0

import torch

from hyflow.algorithms import entropy_from_logits, log_probs_from_logits


def test_entropy_from_logits_equals_the_categorical_entropy():
    torch.manual_seed(0)
    logits = 3 * torch.randn(2, 5, 11)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-5)


def test_log_probs_from_logits_picks_the_log_softmax_of_each_label():
    torch.manual_seed(1)
    logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    expected = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(log_probs_from_logits(logits, labels), expected, atol=1e-6)

"""`token_log_probs` (pipeline/train/token_log_probs.py): equal to log-softmax + gather and the
entropy of the softmax, gradients included, chunk by chunk, for chosen rows only."""

import pytest
import torch

import pipeline.train.token_log_probs as tlp
from pipeline.train.token_log_probs import token_log_probs


def _reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, -1)
    return log_p.gather(1, targets.unsqueeze(1)).squeeze(1), -(log_p.exp() * log_p).sum(-1)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 3 rows of 11 values, so that a chunk boundary falls inside every test batch."""
    monkeypatch.setattr(tlp, "CHUNK_BYTES", 4 * 11 * 3)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_values_equal_log_softmax_and_entropy(small_chunks: None, temperature: float) -> None:
    torch.manual_seed(0)
    logits = torch.randn(10, 11, dtype=torch.float64) * 4
    targets = torch.randint(0, 11, (10,))
    log_probs, entropy = token_log_probs(logits, targets, temperature)
    ref_lp, ref_h = _reference(logits, targets, temperature)
    assert log_probs.dtype == entropy.dtype == torch.float64
    torch.testing.assert_close(log_probs, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, ref_h, rtol=0, atol=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_gradients_pass_gradcheck(small_chunks: None, temperature: float) -> None:
    torch.manual_seed(1)
    logits = (torch.randn(13, 11, dtype=torch.float64) * 3).requires_grad_(True)
    targets = torch.randint(0, 11, (13,))
    rows = torch.tensor([0, 2, 3, 4, 5, 6, 7, 9, 10, 12])  # 4 chunks of up to 3
    assert torch.autograd.gradcheck(lambda x: token_log_probs(x, targets[rows], temperature, rows), (logits,))
    assert torch.autograd.gradcheck(lambda x: token_log_probs(x, targets[rows], temperature, rows)[0], (logits,))
    assert torch.autograd.gradcheck(lambda x: token_log_probs(x, targets[rows], temperature, rows)[1], (logits,))


def test_rows_pick_the_scored_positions_and_the_rest_get_no_gradient(small_chunks: None) -> None:
    torch.manual_seed(2)
    logits = torch.randn(9, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (9,))
    rows = torch.tensor([1, 2, 5, 8])
    log_probs, entropy = token_log_probs(logits, targets[rows], 1.0, rows)
    (log_probs.sum() + 0.5 * entropy.sum()).backward()
    ref_lp, ref_h = _reference(logits.detach()[rows], targets[rows], 1.0)
    torch.testing.assert_close(log_probs, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, ref_h, rtol=0, atol=1e-12)
    dense = logits.detach().clone().requires_grad_(True)
    lp, h = _reference(dense[rows], targets[rows], 1.0)
    (lp.sum() + 0.5 * h.sum()).backward()
    torch.testing.assert_close(logits.grad, dense.grad, rtol=0, atol=1e-12)
    assert not logits.grad[[0, 3, 4, 6, 7]].any()


def test_bfloat16_logits_give_float32_results_and_bfloat16_gradients() -> None:
    torch.manual_seed(3)
    logits = (torch.randn(6, 300) * 3).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 300, (6,))
    log_probs, entropy = token_log_probs(logits, targets)
    assert log_probs.dtype == entropy.dtype == torch.float32
    ref_lp, ref_h = _reference(logits.detach(), targets, 1.0)
    torch.testing.assert_close(log_probs, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, ref_h, rtol=0, atol=1e-5)
    log_probs.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    reference = logits.detach().clone().requires_grad_(True)
    _reference(reference, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(logits.grad.float(), reference.grad.float(), rtol=0, atol=4e-3)


def test_each_row_is_shifted_by_its_own_maximum(small_chunks: None) -> None:
    """Rows of very different scale in one chunk: no row underflows to -inf or NaN."""
    logits = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1003.0], [0.5, 0.0, -0.5]],
                          dtype=torch.float64)
    targets = torch.tensor([0, 2, 1])
    log_probs, entropy = token_log_probs(logits, targets)
    ref_lp, ref_h = _reference(logits, targets, 1.0)
    torch.testing.assert_close(log_probs, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, ref_h, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("args", "message"), [
    ((torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long)), r"token_log_probs needs logits \[R, V\], got \(2, 3, 4\)"),
    ((torch.zeros(2, 3), torch.zeros(3, dtype=torch.long)),
     r"token_log_probs needs rows \[N\] and targets \[N\], got \(2,\) and \(3,\)"),
    ((torch.zeros(4, 3), torch.zeros(2, 2, dtype=torch.long), 1.0, torch.tensor([[0, 1], [2, 3]])),
     r"token_log_probs needs rows \[N\] and targets \[N\], got \(2, 2\) and \(2, 2\)"),
    ((torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 0.0), r"token_log_probs needs a temperature > 0, got 0.0"),
    ((torch.zeros(3, 3), torch.zeros(2, dtype=torch.long), 1.0, torch.tensor([1, 1])),
     "token_log_probs needs distinct rows"),
])
def test_bad_arguments_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        token_log_probs(*args)

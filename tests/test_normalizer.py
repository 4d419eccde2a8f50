import numpy as np
import pytest
import torch

from corral.actors.normalizer import RunningNormalizer


def test_running_statistics_match_numpy_over_all_batches_seen():
    g = torch.Generator().manual_seed(0)
    norm = RunningNormalizer((3,))
    batches = [torch.randn(n, 3, generator=g) * 4 + 2 for n in (5, 17, 1, 40)]
    for x in batches:
        norm.update(x)
    allx = torch.cat(batches).double().numpy()
    assert norm.count.item() == len(allx)
    np.testing.assert_allclose(norm.mean.numpy(), allx.mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), allx.var(0), rtol=1e-10)
    out = norm(torch.as_tensor(allx[:4], dtype=torch.float32))
    expected = (allx[:4] - allx.mean(0)) / np.sqrt(allx.var(0) + 1e-8)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_merging_two_workers_equals_one_normalizer_seeing_everything():
    g = torch.Generator().manual_seed(1)
    a, b, whole = RunningNormalizer((2,)), RunningNormalizer((2,)), RunningNormalizer((2,))
    xa, xb = torch.randn(30, 2, generator=g), torch.randn(11, 2, generator=g) + 3
    a.update(xa)
    b.update(xb)
    whole.update(torch.cat([xa, xb]))
    a.merge(b.count, b.mean, b.var)
    assert torch.allclose(a.mean, whole.mean) and torch.allclose(a.var, whole.var)


def test_statistics_freeze_in_eval_mode_and_travel_in_the_state_dict():
    norm = RunningNormalizer((2,))
    norm.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    norm.eval()
    norm.update(torch.tensor([[100.0, 100.0]]))
    assert norm.count.item() == 2
    copy = RunningNormalizer((2,))
    copy.load_state_dict(norm.state_dict())
    x = torch.tensor([[2.0, 3.0]])
    assert torch.equal(copy(x), norm(x))


def test_clipping_bounds_normalized_values():
    norm = RunningNormalizer((1,), clip=5.0)
    norm.update(torch.tensor([[0.0], [1.0]]))
    assert norm(torch.tensor([[1e6]])).item() == 5.0


def test_non_finite_observations_are_refused_with_a_message():
    norm = RunningNormalizer((2,))
    with pytest.raises(ValueError, match="non-finite"):
        norm.update(torch.tensor([[float("nan"), 0.0]]))
    assert norm.count.item() == 0

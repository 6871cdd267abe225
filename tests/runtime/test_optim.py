"""Optimizers against hand-computed weights for three steps (the same numbers torch.optim 2.13 gives).

Parameter [1, -2] in float64, gradients set by hand: [0.5, 1], then [-1, 0.25], then [0.3, -0.7].
Worked example, SGD lr 0.1 momentum 0.9: v1 = g1 = [0.5, 1] -> p1 = [0.95, -2.1];
v2 = 0.9 v1 + g2 = [-0.55, 1.15] -> p2 = [1.005, -2.215].
Adam lr 0.1 step 1: m/(1-b1) = g, v/(1-b2) = g^2, so p1 = p0 - 0.1 g / (|g| + 1e-8) = [0.900000002, -2.099999999].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from runtime.autograd import Tensor, default_dtype, tensor
from runtime.backend import set_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.optim import SGD, Adam, AdamW, Optimizer, clip_grad_norm

GRADIENTS = [[0.5, 1.0], [-1.0, 0.25], [0.3, -0.7]]


def run_steps(make_optimizer: Callable[[list[Tensor]], Optimizer]) -> list[list[float]]:
    with default_dtype(np.float64):
        param = tensor(np.array([1.0, -2.0]), requires_grad=True)
    optimizer = make_optimizer([param])
    trajectory = []
    for grad in GRADIENTS:
        param.grad = np.array(grad)
        optimizer.step()
        trajectory.append(param.numpy().tolist())
    return trajectory


@pytest.mark.parametrize(
    ("make_optimizer", "expected"),
    [
        (
            lambda ps: SGD(ps, lr=0.1, momentum=0.9),
            [[0.95, -2.1], [1.005, -2.215], [1.0245, -2.2485]],
        ),
        (
            lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
            [[0.905, -2.19], [1.0545, -2.3185], [1.04205, -2.27865]],
        ),
        (
            lambda ps: SGD(ps, lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.1),
            [[0.94, -2.08], [0.9313, -2.1541], [0.9038135, -2.1750195]],
        ),
        (
            lambda ps: Adam(ps, lr=0.1),
            [[0.900000002, -2.099999999], [0.9366103542405654, -2.183059751227727],
             [0.9473774736526891, -2.200246419003971]],
        ),
        (
            lambda ps: Adam(ps, lr=0.1, weight_decay=0.1),
            [[0.9000000016666666, -2.09999999875], [0.9252635194456061, -2.1706400355765036],
             [0.921979323363058, -2.158407285288632]],
        ),
        (
            lambda ps: AdamW(ps, lr=0.1, weight_decay=0.1),
            [[0.890000002, -2.079999999], [0.9177103542205653, -2.1422597512377273],
             [0.9193003700904834, -2.138023821501594]],
        ),
    ],
    ids=["sgd-momentum", "sgd-nesterov", "sgd-dampening-weight-decay", "adam", "adam-l2", "adamw"],
)
def test_three_steps_match_hand_computed_weights(
    make_optimizer: Callable[[list[Tensor]], Optimizer], expected: list[list[float]]
) -> None:
    np.testing.assert_allclose(run_steps(make_optimizer), expected, rtol=1e-12)


def test_plain_sgd_is_p_minus_lr_g() -> None:
    assert run_steps(lambda ps: SGD(ps, lr=0.5))[0] == [0.75, -2.5]


def test_clip_grad_norm_scales_to_max_norm_and_returns_the_total() -> None:
    a = tensor(np.zeros(2), requires_grad=True)
    b = tensor(np.zeros(1), requires_grad=True)
    a.grad, b.grad = np.array([3.0, 4.0], dtype=np.float32), np.array([12.0], dtype=np.float32)
    assert clip_grad_norm([a, b], max_norm=6.5) == pytest.approx(13.0)
    np.testing.assert_allclose(a.grad, [1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(b.grad, [6.0], rtol=1e-6)
    assert clip_grad_norm([a, b], max_norm=100.0) == pytest.approx(6.5, rel=1e-6)
    np.testing.assert_allclose(b.grad, [6.0], rtol=1e-6)  # below the limit: unchanged


class CountingBackend(NumpyBackend):
    """The numpy backend, counting read-backs."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        self.reads += 1
        return super().to_numpy(x)


def clipped(max_norm: float, *, on_device: bool) -> tuple[Any, list[np.ndarray], int]:
    """(returned norm, the gradients after clipping, read-backs) for three float32 gradients of norm 13."""
    backend = CountingBackend()
    previous = set_backend(backend)
    try:
        params = [tensor(np.zeros(shape, np.float32), requires_grad=True) for shape in [(2,), (1,), (1, 1)]]
        grads = [[3.0, 4.0], [12.0], [[0.0]]]
        for param, grad in zip(params, grads, strict=True):
            param.grad = np.array(grad, dtype=np.float32)
        norm = clip_grad_norm(params, max_norm, on_device=on_device)
        return norm, [np.asarray(p.grad) for p in params], backend.reads
    finally:
        set_backend(previous)


@pytest.mark.parametrize("max_norm", [6.5, 100.0])
def test_clip_grad_norm_on_device_matches_the_host_path_without_reading_back(max_norm: float) -> None:
    host_norm, host_grads, host_reads = clipped(max_norm, on_device=False)
    device_norm, device_grads, device_reads = clipped(max_norm, on_device=True)
    assert isinstance(host_norm, float) and host_reads == 1
    assert not isinstance(device_norm, float)  # a 0-d float32 backend array (numpy: an np.float32)
    assert np.shape(device_norm) == () and np.asarray(device_norm).dtype == np.float32
    assert device_reads == 0  # the norm and the scale stay on the backend
    assert float(device_norm) == pytest.approx(host_norm, rel=1e-6) == 13.0
    for got, want in zip(device_grads, host_grads, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)
    if max_norm > 13.0:  # no clipping: the device path multiplies by exactly 1
        assert [g.tolist() for g in device_grads] == [[3.0, 4.0], [12.0], [[0.0]]]
    else:
        np.testing.assert_allclose(device_grads[0], [1.5, 2.0], rtol=1e-6)


def test_clip_grad_norm_without_gradients_is_zero_on_both_paths() -> None:
    param = tensor(np.zeros(2, np.float32), requires_grad=True)
    assert clip_grad_norm([param], 1.0) == 0.0
    norm = clip_grad_norm([param], 1.0, on_device=True)
    assert np.shape(norm) == () and float(norm) == 0.0 and param.grad is None


def test_params_without_grad_are_skipped_and_zero_grad_clears() -> None:
    with default_dtype(np.float64):
        used, unused = tensor([1.0], requires_grad=True), tensor([1.0], requires_grad=True)
    optimizer = Adam([used, unused], lr=0.1)
    used.grad = np.array([1.0])
    optimizer.step()
    assert optimizer.steps == [1, 0]
    assert unused.numpy().tolist() == [1.0]
    optimizer.zero_grad()
    assert used.grad is None


def test_state_dict_round_trip_continues_identically_and_reset_forgets() -> None:
    def fresh() -> tuple[Tensor, Adam]:
        with default_dtype(np.float64):
            param = tensor(np.array([1.0, -2.0]), requires_grad=True)
        return param, Adam([param], lr=0.1)

    param, optimizer = fresh()
    for grad in GRADIENTS[:2]:
        param.grad = np.array(grad)
        optimizer.step()
    saved_weights, saved_state = param.numpy().copy(), optimizer.state_dict()
    assert sorted(saved_state) == ["exp_avg.0", "exp_avg_sq.0", "step"]
    param.grad = np.array(GRADIENTS[2])
    optimizer.step()

    restored_param, restored = fresh()
    restored_param.data = saved_weights
    restored.load_state_dict(saved_state)
    restored_param.grad = np.array(GRADIENTS[2])
    restored.step()
    np.testing.assert_array_equal(restored_param.numpy(), param.numpy())

    restored.reset()
    assert restored.steps == [0] and restored.state_dict().keys() == {"step"}
    with pytest.raises(ValueError, match="unexpected optimizer state key 'bogus.0'"):
        restored.load_state_dict({"step": np.array([1]), "bogus.0": np.zeros(2)})
    with pytest.raises(ValueError, match="shape"):
        restored.load_state_dict({"step": np.array([1]), "exp_avg.0": np.zeros(3)})


def test_invalid_settings_raise() -> None:
    param = tensor(np.zeros(1), requires_grad=True)
    with pytest.raises(ValueError, match="Nesterov"):
        SGD([param], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="empty"):
        Adam([], lr=0.1)

"""Every differentiable op: gradients against central finite differences in float64, values against numpy."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from runtime.autograd import Tensor, default_dtype, no_grad, tensor, unbroadcast
from runtime.autograd import functional as F  # noqa: N812 - the usual alias

RELATIVE_TOLERANCE = 1e-6


def _relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(numeric))), 1e-12)
    return float(np.max(np.abs(analytic - numeric))) / scale


def check_gradients(fn: Callable[..., Tensor], *arrays: np.ndarray, step: float = 1e-6, seed: int = 0) -> None:
    """Compare d(sum(fn(*inputs) * w))/d(input) from backward() with central differences, for random w."""
    inputs = [np.array(a, dtype=np.float64) for a in arrays]
    with default_dtype(np.float64):
        leaves = [tensor(a, requires_grad=True) for a in inputs]
        out = fn(*leaves)
        weights = np.random.default_rng(seed).standard_normal(out.shape)
        (out * weights).sum().backward()

        def objective(values: list[np.ndarray]) -> float:
            with no_grad():
                return float(np.sum(fn(*[tensor(v) for v in values]).numpy() * weights))

        for position, leaf in enumerate(leaves):
            assert leaf.grad is not None, f"input {position} got no gradient"
            assert leaf.grad.dtype == np.float64
            numeric = np.zeros_like(inputs[position])
            for index in np.ndindex(*inputs[position].shape):
                shifted = [v.copy() for v in inputs]
                shifted[position][index] += step
                upper = objective(shifted)
                shifted[position][index] -= 2 * step
                lower = objective(shifted)
                numeric[index] = (upper - lower) / (2 * step)
            error = _relative_error(np.asarray(leaf.grad), numeric)
            assert error < RELATIVE_TOLERANCE, f"input {position}: relative gradient error {error:.2e}"


def rand(*shape: int, seed: int = 1, low: float | None = None) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(shape)
    return np.abs(values) + low if low is not None else values


@pytest.mark.parametrize(
    ("fn", "shapes"),
    [
        (lambda a, b: a + b, [(3, 1), (1, 4)]),
        (lambda a, b: a - b, [(2, 3, 4), (4,)]),
        (lambda a, b: a * b, [(3, 1), (1, 4)]),
        (lambda a, b: a * b, [(), (2, 3)]),
        (lambda a: 2.5 - a * 3.0 + 1.0, [(2, 3)]),
        (lambda a: -a, [(4,)]),
        (lambda a: a.exp(), [(2, 3)]),
        (lambda a: a.tanh(), [(2, 3)]),
        (lambda a: a @ a.T, [(3, 4)]),
        (lambda a, b: a @ b, [(3, 4), (4, 5)]),
        (lambda a, b: a @ b, [(2, 3, 4, 5), (5, 2)]),
        (lambda a, b: a @ b, [(1, 3, 4, 5), (2, 1, 5, 6)]),
        (lambda a: a.sum(), [(3, 4)]),
        (lambda a: a.sum(axis=1, keepdims=True), [(3, 4, 2)]),
        (lambda a: a.sum(axis=(0, 2)), [(3, 4, 2)]),
        (lambda a: a.mean(axis=-1), [(3, 4)]),
        (lambda a: a.max(axis=1), [(3, 5)]),
        (lambda a: a.max(axis=(0, 1), keepdims=True), [(3, 5, 2)]),
        (lambda a: a.reshape(6, 2) * 1.5, [(3, 4)]),
        (lambda a: a.transpose(2, 0, 1), [(2, 3, 4)]),
        (lambda a: a.T, [(2, 3)]),
        (lambda a: a[1:, ::2], [(3, 5)]),
        (lambda a: a[np.array([0, 2, 0, 0])], [(3, 4)]),
        (lambda a: a[:, np.array([1, 1, 3])], [(2, 4)]),
        (lambda a, b: F.concatenate([a, b], axis=1), [(2, 3), (2, 2)]),
        (lambda a: F.split(a, [1, 3], axis=-1)[1] * F.split(a, 2, axis=0)[0][:, :3], [(2, 4)]),
        (lambda a: F.softmax(a), [(3, 5)]),
        (lambda a: F.softmax(a, axis=0), [(3, 5)]),
        (lambda a: F.log_softmax(a), [(2, 3, 5)]),
        (lambda a: F.gelu(a), [(4, 6)]),
        (lambda x, w: F.linear(x, w), [(2, 3, 4), (5, 4)]),
        (lambda x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)]),
        (lambda x, w, b: F.layer_norm(x, w, b), [(2, 3, 6), (6,), (6,)]),
        (lambda x: F.layer_norm(x, None, None), [(4, 5)]),
        (lambda x, w: F.layer_norm(x, w, None), [(4, 5), (5,)]),
    ],
    ids=[
        "add-broadcast-3x1-1x4",
        "sub-broadcast-trailing",
        "mul-broadcast",
        "mul-scalar-tensor",
        "python-scalars",
        "neg",
        "exp",
        "tanh",
        "matmul-self-transpose",
        "matmul-2d",
        "matmul-batch-broadcast-rhs-2d",
        "matmul-batch-broadcast-both",
        "sum-all",
        "sum-axis-keepdims",
        "sum-two-axes",
        "mean-last-axis",
        "max-axis",
        "max-two-axes-keepdims",
        "reshape",
        "permute",
        "transpose-T",
        "slice-step",
        "gather-rows-repeated",
        "gather-columns-repeated",
        "concatenate",
        "split",
        "softmax-last",
        "softmax-axis0",
        "log-softmax",
        "gelu",
        "linear-no-bias",
        "linear-bias",
        "layer-norm",
        "layer-norm-no-affine",
        "layer-norm-weight-only",
    ],
)
def test_gradient_matches_finite_differences(fn: Callable[..., Tensor], shapes: list[tuple[int, ...]]) -> None:
    check_gradients(fn, *[rand(*shape, seed=i + 1) for i, shape in enumerate(shapes)])


def test_gradients_of_ops_that_need_positive_inputs() -> None:
    check_gradients(lambda a: a.log(), rand(3, 4, low=0.5))
    check_gradients(lambda a, b: a / b, rand(3, 1), rand(1, 4, low=0.5))
    check_gradients(lambda a: 2.0 / a, rand(3, low=0.5))
    check_gradients(lambda a: a**3.0, rand(2, 3))
    check_gradients(lambda a, b: a**b, rand(2, 3, low=0.5), rand(1, 3))


def test_relu_gradient_away_from_the_kink() -> None:
    values = rand(4, 5)
    values[np.abs(values) < 0.05] = 0.3
    check_gradients(lambda a: a.relu(), values)


def test_cross_entropy_gradient_and_value_with_ignored_targets() -> None:
    logits = rand(2, 3, 5)
    targets = np.array([[1, -100, 4], [0, 2, -100]])
    check_gradients(lambda x: F.cross_entropy(x, targets), logits)
    loss = F.cross_entropy(tensor(logits, dtype=np.float64), targets).item()
    rows, labels = logits.reshape(-1, 5), targets.reshape(-1)
    log_probs = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    kept = labels != -100
    assert loss == pytest.approx(-log_probs[kept, labels[kept]].mean(), rel=1e-12)


def test_cross_entropy_with_every_target_ignored_is_zero_with_zero_gradient() -> None:
    logits = tensor(rand(2, 4), dtype=np.float64, requires_grad=True)
    loss = F.cross_entropy(logits, np.full(2, -100))
    loss.backward()
    assert loss.item() == 0.0
    assert not np.any(logits.grad)


def test_masked_fill_and_where() -> None:
    mask = np.array([[True, False, False, True]])
    check_gradients(lambda a: F.masked_fill(a, mask, -5.0) * 2.0, rand(3, 4))
    out = F.masked_fill(tensor(np.ones((2, 4))), mask, -5.0).numpy()
    np.testing.assert_array_equal(out, np.where(mask, -5.0, np.ones((2, 4))))
    condition = np.array([[True], [False], [True]])
    check_gradients(lambda a, b: F.where(condition, a, b), rand(3, 4), rand(1, 4))


def test_embedding_with_repeated_ids_accumulates() -> None:
    ids = np.array([[0, 2, 2], [2, 0, 3]])
    check_gradients(lambda w: F.embedding(w, ids), rand(5, 3))
    table = rand(5, 3)
    np.testing.assert_array_equal(F.embedding(tensor(table), ids).numpy(), table[ids].astype(np.float32))
    weight = tensor(table, dtype=np.float64, requires_grad=True)
    F.embedding(weight, ids).sum().backward()
    np.testing.assert_array_equal(weight.grad[:, 0], [2.0, 0.0, 3.0, 1.0, 0.0])


def naive_causal_attention(qkv: np.ndarray, n_head: int) -> np.ndarray:
    batch, length, width3 = qkv.shape
    width = width3 // 3
    head_size = width // n_head
    out = np.zeros((batch, length, width))
    for b in range(batch):
        for h in range(n_head):
            cols = slice(h * head_size, (h + 1) * head_size)
            q, k, v = (qkv[b, :, part * width :][:, cols] for part in range(3))
            scores = q @ k.T / math.sqrt(head_size)
            scores[np.triu_indices(length, k=1)] = -np.inf
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights /= weights.sum(axis=1, keepdims=True)
            out[b, :, cols] = weights @ v
    return out


def test_causal_attention_value_and_gradient() -> None:
    qkv = rand(2, 5, 12)  # B=2, T=5, C=4 with 2 heads of size 2
    check_gradients(lambda x: F.causal_self_attention(x, n_head=2), qkv)
    out = F.causal_self_attention(tensor(qkv, dtype=np.float64), n_head=2).numpy()
    np.testing.assert_allclose(out, naive_causal_attention(qkv, 2), rtol=1e-12, atol=1e-12)


def test_causal_attention_is_causal() -> None:
    qkv = rand(1, 6, 12)
    changed = qkv.copy()
    changed[:, 4:] += 10.0  # perturbing later positions must not change earlier outputs
    before = F.causal_self_attention(tensor(qkv, dtype=np.float64), 2).numpy()
    after = F.causal_self_attention(tensor(changed, dtype=np.float64), 2).numpy()
    np.testing.assert_array_equal(before[:, :4], after[:, :4])
    assert not np.allclose(before[:, 4:], after[:, 4:])


def test_attention_and_dropout_gradients_with_a_fixed_mask() -> None:
    check_gradients(
        lambda x: F.causal_self_attention(x, 2, dropout_p=0.3, rng=np.random.default_rng(7)), rand(2, 4, 12)
    )
    check_gradients(lambda x: F.dropout(x, 0.5, np.random.default_rng(3)), rand(4, 6))


def test_dropout_scales_kept_units_and_is_identity_when_off() -> None:
    x = tensor(np.ones((200, 50)))
    out = F.dropout(x, 0.25, np.random.default_rng(0)).numpy()
    assert set(np.unique(out)) == {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.01
    assert F.dropout(x, 0.25, np.random.default_rng(0), training=False) is x
    assert F.dropout(x, 0.0, None) is x


def test_forward_values_match_numpy_formulas() -> None:
    x = rand(3, 7)
    t = tensor(x, dtype=np.float64)
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(F.gelu(t).numpy(), gelu, rtol=1e-14)
    softmax = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(F.softmax(t).numpy(), softmax, rtol=1e-13)
    np.testing.assert_allclose(F.log_softmax(t).numpy(), np.log(softmax), rtol=1e-13, atol=1e-14)
    weight, bias = rand(7, seed=2), rand(7, seed=3)
    normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * weight + bias
    layer = F.layer_norm(t, tensor(weight, dtype=np.float64), tensor(bias, dtype=np.float64)).numpy()
    np.testing.assert_allclose(layer, normed, rtol=1e-12)
    big = tensor(np.array([[1000.0, 0.0, -1000.0]]))  # stable softmax: no overflow in float32
    np.testing.assert_allclose(F.softmax(big).numpy(), [[1.0, 0.0, 0.0]])


def test_float32_stays_float32_through_the_ops() -> None:
    a = tensor(rand(4, 3), requires_grad=True)
    w = tensor(rand(5, 3), requires_grad=True)
    out = F.layer_norm(F.gelu(F.linear(a, w) * 0.5 + 1.0), None, None)
    loss = F.cross_entropy(out, np.array([0, 1, 2, 3]))
    loss.backward()
    assert a.dtype == np.float32 and out.dtype == np.float32 and loss.dtype == np.float32
    assert a.grad.dtype == np.float32 and w.grad.dtype == np.float32


def test_unbroadcast_sums_to_the_input_shape() -> None:
    grad = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(unbroadcast(grad, (3, 1)), grad.sum(axis=(0, 2))[:, None])
    np.testing.assert_array_equal(unbroadcast(grad, ()), grad.sum())
    assert unbroadcast(grad, (2, 3, 4)) is grad


def test_shared_nodes_accumulate_and_deep_graphs_need_no_recursion() -> None:
    x = tensor(np.array([2.0]), requires_grad=True)
    y = x * x
    (y + y * 3.0).sum().backward()  # d/dx 4x^2 = 8x
    np.testing.assert_allclose(x.grad, [16.0])
    z = tensor(np.array([1.0]), requires_grad=True)
    out = z
    for _ in range(20000):
        out = out * 1.0
    out.sum().backward()
    np.testing.assert_allclose(z.grad, [1.0])


def test_no_grad_records_nothing_and_a_freed_graph_refuses_a_second_backward() -> None:
    x = tensor(np.ones(3), requires_grad=True)
    with no_grad():
        y = (x * 2.0).sum()
    assert not y.requires_grad
    loss = (x * 2.0).sum() * 1.0
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2.0).backward()


def test_no_grad_is_per_thread() -> None:
    """The relay validates under no_grad in one thread while it replays (trains) a unit in another."""
    import threading

    from runtime.autograd import is_grad_enabled, no_grad

    inside, seen_elsewhere = threading.Event(), []
    release = threading.Event()

    def evaluate() -> None:
        with no_grad():
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=evaluate)
    worker.start()
    assert inside.wait(10)
    seen_elsewhere.append(is_grad_enabled())
    release.set()
    worker.join(10)
    assert seen_elsewhere == [True] and is_grad_enabled()

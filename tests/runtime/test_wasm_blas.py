"""The Pyodide matmul path through scipy's sgemm gives numpy's products for every transpose combination."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.backend import get_backend
from runtime.backend.numpy_backend import _sgemm_matmul, use_sgemm

blas = pytest.importorskip("scipy.linalg.blas", reason="scipy is the oracle for the sgemm view trick")


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
def test_sgemm_views_match_numpy(transpose_a: bool, transpose_b: bool, contiguous: bool) -> None:
    rng = np.random.default_rng(0)
    m, k, n = 7, 5, 3
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    if not contiguous:  # strided inputs make f2py copy; the result must not change
        a = np.repeat(a, 2, axis=1)[:, ::2]
        b = np.repeat(b, 2, axis=1)[:, ::2]
    expected = (a.T if transpose_a else a) @ (b.T if transpose_b else b)
    result = _sgemm_matmul(blas.sgemm, a, b, transpose_a, transpose_b)
    assert result.shape == (m, n) and result.dtype == np.float32 and result.flags.c_contiguous
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def test_backend_matmul_switches_to_sgemm_and_back() -> None:
    calls: list[int] = []

    def counting_sgemm(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(1)
        return blas.sgemm(*args, **kwargs)

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    use_sgemm(counting_sgemm)
    try:
        np.testing.assert_allclose(get_backend().matmul(a, b), a @ b)
        np.testing.assert_allclose(get_backend().matmul(b, b, transpose_a=True), b.T @ b)
        assert len(calls) == 2
    finally:
        use_sgemm(None)
    get_backend().matmul(a, b)
    assert len(calls) == 2

"""The WebAssembly matmul kernel: the assembler's encoding, and the kernel itself run in real Pyodide (under Node).

The oracle for the kernel is a float32 loop over the summed axis with separate multiply and add; the kernel
promises exactly that order, so results are compared bit for bit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from runtime.backend import wasm, wasm_gemm

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("pyodide_node.js")


def run_node(arguments: list[str], stdin: bytes) -> bytes:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (set-up installs it with npm)")
    done = subprocess.run([node, *arguments], input=stdin, capture_output=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout


def run_pyodide(code: str) -> dict:
    """``code`` in Pyodide under Node with numpy and the runtime wheel from ``wheels/``; its last value as JSON."""
    if not (ROOT / "wheels" / "pyodide-lock.json").is_file() or not (ROOT / "web/node_modules/pyodide").is_dir():
        pytest.skip("wheels/ or web/node_modules is missing: run `make setup`")
    return json.loads(run_node([str(HARNESS)], code.encode()))


def test_leb128_encodings() -> None:
    assert wasm.uleb(0) == b"\x00" and wasm.uleb(127) == b"\x7f" and wasm.uleb(128) == b"\x80\x01"
    assert wasm.uleb(624485) == b"\xe5\x8e\x26"
    assert wasm.sleb(-1) == b"\x7f" and wasm.sleb(63) == b"\x3f" and wasm.sleb(64) == b"\xc0\x00"
    assert wasm.sleb(-123456) == b"\xc0\xbb\x78"


@pytest.mark.parametrize(("body", "message"), [
    ("local.get $x\nf32.frobnicate", "line 2"),
    ("local.get $nope", "line 1"),
    ("block $a\nbr_if $b\nend", r"no enclosing block or loop named \$b"),
    ("block $a", "left open"),
    ("end", "without a block"),
    ("v128.load align=32", "alignment above the natural one"),
])
def test_assembler_refuses_what_it_does_not_know(body: str, message: str) -> None:
    with pytest.raises(wasm.WasmError, match=message):
        wasm.side_module([wasm.Function("f", [("x", "i32")], body)])


def test_module_is_valid_webassembly_with_a_dylink_section() -> None:
    binary = wasm_gemm.module_bytes()
    assert binary[:8] == b"\x00asm\x01\x00\x00\x00"
    assert binary[8] == 0 and binary[10:19] == b"\x08dylink.0"  # Emscripten reads the first section
    script = ("const b = require('fs').readFileSync(0); const m = new WebAssembly.Module(b);"
              "process.stdout.write(JSON.stringify({valid: WebAssembly.validate(b),"
              " exports: WebAssembly.Module.exports(m), imports: WebAssembly.Module.imports(m)}))")
    info = json.loads(run_node(["-e", script], binary))
    assert info["valid"] is True
    assert info["exports"] == [{"name": wasm_gemm.SYMBOL, "kind": "function"}]
    assert info["imports"] == [{"module": "env", "name": "memory", "kind": "memory"}]


KERNEL_CASES = r"""
import json
import numpy as np
from runtime.backend import get_backend, numpy_backend, wasm_gemm

def oracle(a, b):
    out = np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), np.float32)
    for p in range(a.shape[-1]):
        out = out + a[..., :, p:p + 1] * b[..., p:p + 1, :]
    return out

rng = np.random.default_rng(0)
gemm = wasm_gemm.load()
results = []
cases = [((1, 1), (1, 1)), ((3, 2), (2, 5)), ((4, 1), (1, 8)), ((5, 7), (7, 9)), ((8, 3), (3, 16)),
         ((13, 33), (33, 17)), ((2, 3, 64, 24), (2, 3, 24, 64)), ((2, 5, 6), (6, 11)), ((7, 4), (3, 4, 12)),
         ((2, 1, 9, 5), (1, 3, 5, 8)), ((64, 96), (96, 384))]
for a_shape, b_shape in cases:
    for transpose_a in (False, True):
        for transpose_b in (False, True):
            for strided in (False, True):
                a = rng.standard_normal(a_shape).astype(np.float32)
                b = rng.standard_normal(b_shape).astype(np.float32)
                stored_a = np.swapaxes(a, -1, -2).copy() if transpose_a else a
                stored_b = np.swapaxes(b, -1, -2).copy() if transpose_b else b
                if strided:  # every other column of a wider array: rows are not contiguous
                    stored_a = np.repeat(stored_a, 2, axis=-1)[..., ::2]
                    stored_b = np.repeat(stored_b, 2, axis=-1)[..., ::2]
                view_a = np.swapaxes(stored_a, -1, -2) if transpose_a else stored_a
                view_b = np.swapaxes(stored_b, -1, -2) if transpose_b else stored_b
                got = wasm_gemm.matmul(gemm, view_a, view_b)
                want = oracle(a, b)
                results.append({"case": [a_shape, b_shape, transpose_a, transpose_b, strided],
                                "shape_ok": got.shape == want.shape, "contiguous": bool(got.flags.c_contiguous),
                                "bit_equal": bool(np.array_equal(got, want)),
                                "numpy_equal": bool(np.array_equal(got, np.matmul(a, b)))})
untouched = rng.standard_normal((5, 6)).astype(np.float32)
copy = untouched.copy()
wasm_gemm.matmul(gemm, untouched, untouched.T)
declined = [wasm_gemm.matmul(gemm, np.ones(3, np.float32), np.ones((3, 2), np.float32)),
            wasm_gemm.matmul(gemm, np.ones((2, 3)), np.ones((3, 2))),
            wasm_gemm.matmul(gemm, np.ones((2, 0), np.float32), np.ones((0, 2), np.float32))]
shown = wasm_gemm.install()
backend = get_backend()
a = rng.standard_normal((6, 10)).astype(np.float32)
w = rng.standard_normal((4, 10)).astype(np.float32)
routed = bool(np.array_equal(backend.matmul(a, w, transpose_b=True), oracle(a, w.T)))
fallback = backend.matmul(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)).tolist()
numpy_backend.use_matmul(None)
json.dumps({"results": results, "inputs_untouched": bool(np.array_equal(untouched, copy)),
            "declined": [d is None for d in declined], "shown": shown, "routed": routed, "fallback": fallback})
"""


def test_kernel_in_pyodide_is_bit_exact_for_every_layout() -> None:
    report = run_pyodide(KERNEL_CASES)
    wrong = [r["case"] for r in report["results"] if not (r["shape_ok"] and r["contiguous"] and r["bit_equal"])]
    assert not wrong, f"kernel differs from the float32 oracle for {wrong}"
    assert len(report["results"]) == 88
    assert report["inputs_untouched"] is True
    assert report["declined"] == [True, True, True]  # 1-D, float64 and empty products stay with numpy
    assert "SIMD" in report["shown"]
    assert report["routed"] is True
    assert report["fallback"] == [[0.0] * 3] * 2


TRAINING_WITH_AND_WITHOUT = r"""
import json
import numpy as np
from runtime.backend import numpy_backend, wasm_gemm
from runtime.models.transformer import Transformer, preset
from runtime.optim import Adam

def steps():
    model = Transformer(preset("bytelm-2.3mb"), seed=3)
    optimizer = Adam(model.parameters(), lr=1e-3)
    tokens = np.random.default_rng(5).integers(0, 256, size=(4, 65))
    losses = []
    for _ in range(2):
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, np.concatenate([p.numpy().ravel() for p in model.parameters()])

plain_losses, plain = steps()
wasm_gemm.install()
kernel_losses, kernel = steps()
numpy_backend.use_matmul(None)
json.dumps({"plain": plain_losses, "kernel": kernel_losses, "same_weights": bool(np.array_equal(plain, kernel))})
"""


def test_training_with_the_kernel_is_bit_identical_to_pyodides_numpy() -> None:
    """Pyodide's numpy matmul (no BLAS) sums in the same order, so switching the kernel on changes no bit."""
    report = run_pyodide(TRAINING_WITH_AND_WITHOUT)
    assert report["plain"] == report["kernel"]
    assert report["plain"][1] < report["plain"][0]
    assert report["same_weights"] is True

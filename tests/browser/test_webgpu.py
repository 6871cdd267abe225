"""The WebGPU backend in the page's worker (headless Chromium, WebGPU on SwiftShader) against the numpy backend.

One page serves every test (module-scoped); each test sends Python source to the worker, which runs it
with `runPythonAsync`, so the code can `await` and blocking reads work through JSPI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from server.browser.launcher import READY_SELECTOR, run_in_worker, with_test_flag

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Runs in the worker: every primitive on both backends with the same inputs; returns {check: [ok, error]}.
PRIMITIVES = r"""
import json, math
import numpy as np
from runtime.backend import get_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.backend.webgpu import create_backend

gpu, cpu = await create_backend(), NumpyBackend()
rng = np.random.default_rng(0)
results = {}

def r(*shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, size=shape).astype(np.float32)

def host(backend, value):
    if isinstance(value, tuple | list):
        return [host(backend, v) for v in value]
    if value is None or isinstance(value, int | float):
        return value
    return np.asarray(backend.to_numpy(value), dtype=np.float64)

def close(got, want, rtol, atol):
    if isinstance(want, list):
        return max((close(g, w, rtol, atol) for g, w in zip(got, want, strict=True)), default=0.0)
    if want is None or isinstance(want, int | float):
        return 0.0 if got == want else math.inf
    if got.shape != want.shape:
        return math.inf
    excess = np.abs(got - want) - (atol + rtol * np.abs(want))
    return float(excess.max(initial=-1.0))

def check(name, fn, *arrays, rtol=1e-5, atol=1e-6):
    try:
        want = host(cpu, fn(cpu, *[cpu.from_numpy(a.copy()) for a in arrays]))
        got = host(gpu, fn(gpu, *[gpu.from_numpy(a.copy()) for a in arrays]))
        excess = close(got, want, rtol, atol)
        results[name] = [bool(excess <= 0), excess]
    except Exception as error:
        results[name] = [False, repr(error)]

x, y, pos = r(3, 4, 5), r(4, 5), r(3, 4, 5, low=0.1, high=3.0)
check("transfer", lambda b, a: b.from_numpy(b.to_numpy(a)), x)
check("zeros", lambda b: b.zeros((2, 3), np.float32))
check("full", lambda b: b.full((2, 3), 1.5, np.float32))
for op in ("neg", "exp", "tanh", "relu", "abs", "sign", "step"):
    check(f"unary.{op}", lambda b, a, op=op: b.unary(op, a), x)
for op in ("log", "sqrt"):
    check(f"unary.{op}", lambda b, a, op=op: b.unary(op, a), pos)
check("unary.tanh.large", lambda b, a: b.unary("tanh", a), r(50, low=-30, high=30))
for op in ("add", "sub", "mul", "div", "maximum"):
    check(f"binary.{op}.broadcast", lambda b, a, c, op=op: b.binary(op, a, c), x, y)
    check(f"binary.{op}.scalar", lambda b, a, op=op: b.binary(op, a, 0.75), x)
check("binary.pow.square", lambda b, a: b.binary("pow", a, 2.0), x)
check("binary.pow.cube", lambda b, a: b.binary("pow", a, 3.0), x)
check("binary.pow.array", lambda b, a, c: b.binary("pow", a, c), pos, r(4, 5))
rounded, rounded_other = np.round(x), np.round(y)
for op in ("eq", "gt", "ge", "lt", "le", "ne"):
    check(f"compare.{op}", lambda b, a, c, op=op: b.compare(op, a, c), rounded, rounded_other)
check("where", lambda b, a, c: b.where(b.compare("gt", a, 0.0), a, c), x, y)
check("where.scalars", lambda b, a: b.where(b.compare("gt", a, 0.0), 0.0, a), x)
for kernel in ("matmul", "matmul_direct"):  # the tiled kernel and the barrier-free one (SwiftShader)
    gpu.matmul_kernel = kernel
    check(f"matmul.{kernel}", lambda b, a, c: b.matmul(a, c), r(5, 7), r(7, 3))
    check(f"matmul.{kernel}.tiles", lambda b, a, c: b.matmul(a, c), r(40, 33), r(33, 50), rtol=1e-5, atol=1e-5)
    check(f"matmul.{kernel}.transpose_a", lambda b, a, c: b.matmul(a, c, transpose_a=True), r(7, 5), r(7, 3))
    check(f"matmul.{kernel}.transpose_b", lambda b, a, c: b.matmul(a, c, transpose_b=True), r(5, 7), r(3, 7))
    check(f"matmul.{kernel}.batched", lambda b, a, c: b.matmul(a, c), r(2, 3, 5, 7), r(7, 4))
    check(f"matmul.{kernel}.broadcast_batch", lambda b, a, c: b.matmul(a, c, transpose_b=True), r(2, 1, 5, 7),
          r(3, 4, 7))
gpu.matmul_kernel = "matmul_direct" if "swiftshader" in gpu.context.adapter_info else "matmul"
for op in ("sum", "max"):
    for axes in ((0,), (1,), (0, 2), (2,), None):
        for keep in (False, True):
            check(f"reduce.{op}.{axes}.{keep}", lambda b, a, op=op, axes=axes, keep=keep:
                  b.reduce(op, a, axes, keep), x)
check("reduce.view", lambda b, a: b.reduce("sum", b.permute(a, (2, 0, 1)), (1,), False), x)
check("reshape", lambda b, a: b.reshape(a, (4, -1)), x)
check("permute", lambda b, a: b.reshape(b.permute(a, (2, 0, 1)), (-1,)), x)
check("broadcast_to", lambda b, a: b.unary("neg", b.broadcast_to(a, (3, 4, 5))), y)
check("slice_axis", lambda b, a: b.unary("neg", b.slice_axis(a, 1, 1, 3)), x)
check("concatenate", lambda b, a, c: b.concatenate([a, c, a], 1), x, r(3, 2, 5))
key = (slice(None), np.array([0, 2, 2]), slice(1, 4))
check("index", lambda b, a: b.index(a, key), x)
check("index.int_array", lambda b, a: b.index(a, np.array([2, 0, 2])), x)
check("index_add", lambda b, v: b.index_add((3, 4, 5), key, v), r(3, 3, 3))
ids = np.array([[1, 4, 1], [0, 4, 4]])
check("take_rows", lambda b, t: b.take_rows(t, ids), r(6, 5))
check("scatter_add_rows", lambda b, g: b.scatter_add_rows(ids, g, 6), r(2, 3, 5))
check("dropout_mask", lambda b: b.dropout_mask((4, 6), 0.3, np.random.default_rng(1), np.float32))
check("gelu", lambda b, a: list(b.gelu(a)), x)
check("gelu_backward", lambda b, a, g: b.gelu_backward(a, b.gelu(a)[1], g), x, r(3, 4, 5))
for axis in (-1, 0):
    check(f"softmax.{axis}", lambda b, a, axis=axis: b.softmax(a, axis), x)
    check(f"log_softmax.{axis}", lambda b, a, axis=axis: b.log_softmax(a, axis), x)
    check(f"softmax_backward.{axis}", lambda b, a, g, axis=axis:
          b.softmax_backward(b.softmax(a, axis), g, axis), x, x[::-1].copy())
    check(f"log_softmax_backward.{axis}", lambda b, a, g, axis=axis:
          b.log_softmax_backward(b.log_softmax(a, axis), g, axis), x, x[::-1].copy())
targets = np.array([1, 0, -100, 4, 2, 3])
check("cross_entropy", lambda b, a: list(b.cross_entropy(a, targets, -100)), r(6, 5))
check("cross_entropy_backward", lambda b, a, g: b.cross_entropy_backward(
    b.cross_entropy(a, targets, -100)[1], targets, -100, 5, b.reshape(g, ())), r(6, 5), r(1))
check("layer_norm", lambda b, a, w, c: list(b.layer_norm(a, w, c, 1e-5)), x, r(5), r(5))
check("layer_norm.plain", lambda b, a: list(b.layer_norm(a, None, None, 1e-5)), x)
def ln_backward(b, a, w, g, with_weight):
    _, normalized, rstd = b.layer_norm(a, w if with_weight else None, None, 1e-5)
    return list(b.layer_norm_backward(normalized, rstd, w if with_weight else None, g, with_bias=with_weight))
check("layer_norm_backward", lambda b, a, w, g: ln_backward(b, a, w, g, True), x, r(5), r(3, 4, 5), atol=2e-6)
check("layer_norm_backward.plain", lambda b, a, w, g: ln_backward(b, a, w, g, False), x, r(5), r(3, 4, 5), atol=2e-6)
qkv, grad_y = r(2, 5, 24), r(2, 5, 8)
check("causal_attention", lambda b, q: list(b.causal_attention(q, 2, None)), qkv)
check("causal_attention_backward", lambda b, q, g: b.causal_attention_backward(
    q, b.causal_attention(q, 2, None)[1], 2, None, g), qkv, grad_y)
mask = (r(2, 2, 5, 5) > 0).astype(np.float32) * 2
check("causal_attention.dropout", lambda b, q, m: list(b.causal_attention(q, 2, m)), qkv, mask)
check("causal_attention_backward.dropout", lambda b, q, g, m: b.causal_attention_backward(
    q, b.causal_attention(q, 2, m)[1], 2, m, g), qkv, grad_y, mask)
def sgd(b, p, g, buf, momentum, nesterov, wd, steps):
    state = None
    for _ in range(steps):
        state = b.sgd_momentum_update(p, g, state, lr=0.1, momentum=momentum, dampening=0.0, nesterov=nesterov,
                                      weight_decay=wd)
    return [p, state]
for label, momentum, nesterov, wd, steps in (("plain", 0.0, False, 0.0, 1), ("momentum", 0.9, False, 0.01, 3),
                                             ("nesterov", 0.9, True, 0.0, 2)):
    check(f"sgd_momentum_update.{label}", lambda b, p, g, s, m=momentum, n=nesterov, wd=wd, k=steps:
          sgd(b, p, g, s, m, n, wd, k), r(4, 3), r(4, 3), r(4, 3))
def adam(b, p, g, wd, decoupled):
    m, v = b.zeros(p.shape, np.float32), b.zeros(p.shape, np.float32)
    for step in (1, 2, 3):
        b.adam_update(p, g, m, v, step=step, lr=0.01, beta_1=0.9, beta_2=0.999, eps=1e-8, weight_decay=wd,
                      decoupled_weight_decay=decoupled)
    return [p, m, v]
check("adam_update", lambda b, p, g: adam(b, p, g, 0.0, False), r(4, 3), r(4, 3))
check("adam_update.l2", lambda b, p, g: adam(b, p, g, 0.1, False), r(4, 3), r(4, 3))
check("adam_update.decoupled", lambda b, p, g: adam(b, p, g, 0.1, True), r(4, 3), r(4, 3))
check("squared_norm", lambda b, a: b.squared_norm(a), x)
json.dumps(results)
"""

# Gradients through the autograd front end: the same graphs on both backends.
GRADIENTS = r"""
import json
import numpy as np
from runtime.autograd import functional as F, tensor
from runtime.backend import set_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.backend.webgpu import create_backend

gpu, cpu = await create_backend(), NumpyBackend()
rng = np.random.default_rng(1)
inputs = {"x": rng.normal(size=(4, 6)), "w": rng.normal(size=(5, 6)) * 0.5, "b": rng.normal(size=5),
          "p": rng.uniform(0.5, 2.0, size=(4, 5)), "qkv": rng.normal(size=(2, 4, 12)), "g": rng.normal(size=6)}
graphs = {
    "elementwise": lambda t: ((t["x"] * 2 - t["x"].exp() / 3).tanh() + (-t["x"]).relu() ** 2).sum(),
    "log_div_pow": lambda t: (t["p"].log() / (t["p"] + 1) + t["p"] ** t["p"]).mean(),
    "linear_max": lambda t: F.linear(t["x"], t["w"], t["b"]).max(axis=1).sum(),
    "matmul_transpose": lambda t: (t["x"] @ t["w"].T).reshape(2, 10).transpose(1, 0)[3:7].sum(),
    "softmaxes": lambda t: (F.softmax(t["x"], -1) * F.log_softmax(t["x"], 0)).sum(),
    "cross_entropy": lambda t: F.cross_entropy(F.linear(t["x"], t["w"], t["b"]), np.array([1, 4, -100, 0])),
    "layer_norm_gelu": lambda t: (F.gelu(F.layer_norm(t["x"], t["g"], t["g"] * 0.1)) ** 2).sum(),
    "embedding": lambda t: (F.embedding(t["x"], np.array([[0, 3], [3, 3]])) ** 2).sum(),
    "attention": lambda t: (F.causal_self_attention(t["qkv"], 2) ** 2).sum(),
    "where_concat_split": lambda t: sum((s * s).sum() for s in F.split(F.concatenate(
        [F.where(t["x"].numpy() > 0, t["x"], 0.5), t["x"]], 0), [3, 5], 0)),
    "index": lambda t: (t["x"][np.array([0, 2, 2])] * t["x"][1:4]).sum(),
}
results = {}
for name, graph in graphs.items():
    grads = []
    for backend in (cpu, gpu):
        previous = set_backend(backend)
        try:
            leaves = {k: tensor(v.astype(np.float32), requires_grad=True) for k, v in inputs.items()}
            loss = graph(leaves)
            loss.backward()
            grads.append({"loss": loss.numpy().astype(np.float64)} | {
                k: v.grad if v.grad is None else np.asarray(backend.to_numpy(v.grad), dtype=np.float64)
                for k, v in leaves.items()})
        finally:
            set_backend(previous)
    worst = 0.0
    for k, want in grads[0].items():
        got = grads[1][k]
        if want is None or got is None:
            worst = worst if want is None and got is None else float("inf")
            continue
        worst = max(worst, float((np.abs(got - want) - (1e-5 + 1e-4 * np.abs(want))).max()))
    results[name] = [worst <= 0, worst]
json.dumps(results)
"""


# The hybrid CartPole update: play on the CPU, then three update_policy steps on each backend from the same weights.
CARTPOLE_PARITY = r"""
import json
import numpy as np
from runtime.backend import set_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.backend.webgpu import create_backend
from runtime.optim import Adam
from runtime.tasks.cartpole import CartPoleTask, make_batch, update_policy

task = CartPoleTask({"episodes_per_unit": 8})
weights = task.flat_weights(task.build_model(3))
batch = make_batch(task.policy(weights), task.play(weights, 11, 8), task.settings)
gpu = await create_backend()

def update(backend):
    previous = set_backend(backend)
    try:
        policy = task.policy(weights)
        optimizer = Adam(policy.parameters(), lr=task.settings.lr)
        losses, reads = [], getattr(getattr(backend, "context", None), "reads", 0)
        for _ in range(3):  # a tight clip ratio so that later updates have clipped rows
            losses.append(update_policy(policy, optimizer, batch, clip_ratio=0.02))
        reads = getattr(getattr(backend, "context", None), "reads", 0) - reads
        return losses, task.flat_weights(policy), reads
    finally:
        set_backend(previous)

(cpu_loss, cpu_weights, _), (gpu_loss, gpu_weights, gpu_reads) = update(NumpyBackend()), update(gpu)
json.dumps({"rows": len(batch), "weights": int(cpu_weights.size), "losses": [cpu_loss, gpu_loss],
            "reads_per_update": gpu_reads / 3,
            "max_abs": float(np.abs(cpu_weights - gpu_weights).max()),
            "moved": float(np.abs(cpu_weights - weights).max())})
"""

# One Adam step (with dropout and clipping on the device) of a small transformer, read back once.
TRANSFORMER_PARITY = r"""
import json
import numpy as np
from runtime.backend import set_backend
from runtime.backend.numpy_backend import NumpyBackend
from runtime.backend.webgpu import create_backend
from runtime.train_step import lm_step_async
from runtime.models.transformer import Transformer, TransformerConfig
from runtime.optim import Adam

config = TransformerConfig(vocab_size=32, context=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
tokens = np.random.default_rng(4).integers(0, 32, size=(4, 17))
gpu = await create_backend()
outcome = {}
for backend in (NumpyBackend(), gpu):
    previous = set_backend(backend)
    try:
        model = Transformer(config, seed=2)
        optimizer = Adam(model.parameters(), lr=1e-3)
        reads = getattr(getattr(backend, "context", None), "reads", 0)
        loss = await lm_step_async(model, optimizer, tokens, clip=0.5)
        reads = getattr(getattr(backend, "context", None), "reads", 0) - reads
        weights = np.concatenate([p.numpy().ravel() for p in model.parameters()])
        outcome[backend.name] = (loss, weights, reads)
    finally:
        set_backend(previous)
(cpu_loss, cpu_w, _), (gpu_loss, gpu_w, gpu_reads) = outcome["numpy"], outcome["webgpu"]
json.dumps({"losses": [cpu_loss, gpu_loss], "max_abs": float(np.abs(cpu_w - gpu_w).max()),
            "reads_per_step": gpu_reads, "weights": int(cpu_w.size)})
"""

AUTO_CHOICE = r"""
import json
from runtime.device import choose_device
from runtime.tasks.cartpole import CartPoleTask

choice, backend = await choose_device("auto", CartPoleTask().device_probe(rows=256), steps=2)
json.dumps(choice.to_dict() | {"backend": backend.name})
"""

# navigator.gpu hidden in the worker (an own property shadowing the prototype's getter), then restored.
NO_WEBGPU = r"""
import json
from js import Object, Reflect, navigator
from pyodide.ffi import to_js
from runtime.device import choose_device
from runtime.tasks.cartpole import CartPoleTask

Object.defineProperty(navigator, "gpu", to_js({"value": None, "configurable": True}, dict_converter=Object.fromEntries))
try:
    choice, backend = await choose_device("auto", CartPoleTask().device_probe(), steps=1)
finally:
    Reflect.deleteProperty(navigator, "gpu")
json.dumps(choice.to_dict() | {"backend": backend.name})
"""


@pytest.fixture(scope="module")
def worker(browser: Browser, relay_url: str) -> Iterator[Page]:
    page = browser.new_page()
    page.goto(with_test_flag(relay_url))
    page.locator(READY_SELECTOR).wait_for(timeout=120_000)
    assert page.evaluate("window.peertrain.state") == "ready"
    yield page
    page.close()


def run_json(page: Page, code: str, timeout_s: float = 600) -> dict:
    return json.loads(run_in_worker(page, code, timeout_s=timeout_s))


def test_every_primitive_matches_numpy(worker: Page) -> None:
    results = run_json(worker, PRIMITIVES)
    failures = {name: detail for name, (ok, detail) in results.items() if not ok}
    assert failures == {}
    methods = {"from_numpy", "to_numpy", "zeros", "full", "unary", "binary", "compare", "where", "matmul", "reduce",
               "reshape", "permute", "broadcast_to", "slice_axis", "concatenate", "index", "index_add", "take_rows",
               "scatter_add_rows", "dropout_mask", "gelu", "gelu_backward", "softmax", "softmax_backward",
               "log_softmax", "log_softmax_backward", "cross_entropy", "cross_entropy_backward", "layer_norm",
               "layer_norm_backward", "causal_attention", "causal_attention_backward", "sgd_momentum_update",
               "adam_update", "squared_norm"}
    checked = {name.split(".")[0] for name in results} | {"from_numpy", "to_numpy"}
    assert methods - checked == set()


def test_gradients_through_autograd_match_numpy(worker: Page) -> None:
    results = run_json(worker, GRADIENTS)
    failures = {name: detail for name, (ok, detail) in results.items() if not ok}
    assert failures == {}
    assert len(results) == 11


def test_cartpole_update_on_webgpu_matches_numpy(worker: Page) -> None:
    result = run_json(worker, CARTPOLE_PARITY)
    assert result["weights"] == 114 and result["rows"] > 8
    assert result["moved"] > 1e-3  # the update changed the weights
    assert result["max_abs"] <= 1e-6
    assert result["losses"][1] == pytest.approx(result["losses"][0], rel=1e-5, abs=1e-6)
    assert result["reads_per_update"] == 1  # the loss; the clip mask is made on the device


def test_transformer_step_on_webgpu_matches_numpy_with_one_read(worker: Page) -> None:
    result = run_json(worker, TRANSFORMER_PARITY)
    assert result["losses"][1] == pytest.approx(result["losses"][0], rel=1e-4)
    assert result["max_abs"] <= 1e-4
    assert result["reads_per_step"] == 1


def test_auto_device_reports_both_timings_to_the_page(worker: Page) -> None:
    result = run_json(worker, AUTO_CHOICE)
    assert result["chosen"] in ("cpu", "webgpu") and result["backend"] == ("webgpu" if result["chosen"] == "webgpu"
                                                                            else "numpy")
    assert result["cpu_ms"] > 0 and result["webgpu_ms"] > 0
    shown = worker.evaluate("window.peertrain.device")
    assert shown["chosen"] == result["chosen"] and shown["cpu_ms"] == pytest.approx(result["cpu_ms"])
    assert "WebGPU" in worker.inner_text("#device") and "CPU" in worker.inner_text("#device")


def test_missing_webgpu_falls_back_to_cpu_and_says_so(worker: Page) -> None:
    result = run_json(worker, NO_WEBGPU)
    assert result["chosen"] == "cpu" and result["backend"] == "numpy"
    assert "navigator.gpu is missing" in result["reason"] and result["webgpu_ms"] is None
    assert "navigator.gpu is missing" in worker.inner_text("#device")
    assert worker.evaluate("window.peertrain.device.chosen") == "cpu"

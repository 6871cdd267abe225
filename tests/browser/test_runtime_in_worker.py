"""The same training step runs in the browser worker (Pyodide) and in CPython, with the same losses."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page

from server.browser.launcher import READY_SELECTOR, run_in_worker, with_test_flag

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# One source, run verbatim by both interpreters: build bytelm-2.3mb from a seed, take Adam steps on a
# seeded batch of 16 x 64 tokens, report the losses and a checksum of the final weights.
TRAINING_STEPS = """
import json
import numpy as np
from runtime.models.transformer import Transformer, preset
from runtime.optim import Adam

model = Transformer(preset("bytelm-2.3mb"), seed=3)
optimizer = Adam(model.parameters(), lr=1e-3)
tokens = np.random.default_rng(5).integers(0, 256, size=(16, 65))
losses = []
for _ in range(3):
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
weights = np.concatenate([p.numpy().ravel() for p in model.parameters()])
report = json.dumps({"losses": losses, "weight_sum": float(np.abs(weights.astype(np.float64)).sum()),
                     "numpy": np.__version__})
report
"""


def run_in_cpython(code: str) -> str:
    *body, last = code.strip().splitlines()
    scope: dict = {}
    exec("\n".join(body), scope)
    return str(eval(last, scope))


def test_bytelm_training_steps_match_cpython(page: Page, relay_url: str) -> None:
    page.goto(with_test_flag(relay_url))
    page.locator(READY_SELECTOR).wait_for(timeout=90_000)
    assert page.evaluate("window.peertrain.state") == "ready"

    in_browser = json.loads(run_in_worker(page, TRAINING_STEPS, timeout_s=300))
    native = json.loads(run_in_cpython(TRAINING_STEPS))

    assert in_browser["numpy"] == "2.0.2"
    assert len(in_browser["losses"]) == 3
    for browser_loss, native_loss in zip(in_browser["losses"], native["losses"], strict=True):
        assert browser_loss == pytest.approx(native_loss, abs=1e-4)
    assert in_browser["losses"][-1] < in_browser["losses"][0]  # it is training, not just evaluating
    assert in_browser["weight_sum"] == pytest.approx(native["weight_sum"], rel=1e-4)


# The update codecs must give the same bytes in a browser and natively: a host replay and a second peer's copy
# compare encoded results, and a peer rebuilds the relay's quantized step bit for bit.
CODEC_BYTES = """
import hashlib, json
import numpy as np
from runtime.codec import Codec, ErrorFeedback

rng = np.random.default_rng(9)
update = (rng.standard_normal(50_000) * rng.uniform(0.0, 0.1, 50_000)).astype(np.float32)
digests = {}
for codec in (Codec("int8"), Codec("topk", 0.03)):
    feedback = ErrorFeedback(update.size)
    parts = [feedback.encode(codec, update * (unit + 1), seed=1000 + unit)[0] for unit in range(3)]
    digests[codec.name] = hashlib.sha256(b"".join(parts) + feedback.residual.tobytes()).hexdigest()
json.dumps(digests)
"""


def test_update_codecs_give_the_same_bytes_as_cpython(page: Page, relay_url: str) -> None:
    page.goto(with_test_flag(relay_url))
    page.locator(READY_SELECTOR).wait_for(timeout=90_000)
    in_browser = json.loads(run_in_worker(page, CODEC_BYTES, timeout_s=120))
    assert in_browser == json.loads(run_in_cpython(CODEC_BYTES))

"""Training-throughput measurement of the runtime itself, callable in CPython and in Pyodide.

`peertrain bench` calls `train_steps_throughput` and compares it with the torch anchor
(`tests/runtime/torch_oracle.py --bench`) in the same run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from runtime.models.transformer import Transformer, preset
from runtime.optim import Adam
from runtime.train_step import lm_step


def peak_rss_mb() -> float | None:
    """Peak resident memory of this process in MiB, or None where `resource` is missing (Pyodide)."""
    import sys

    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, AttributeError):
        return None
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def train_steps_throughput(
    config_name: str = "bytelm-2.3mb", steps: int = 20, batch: int = 16, seq: int = 64, seed: int = 0,
    warmup: int = 3,
) -> dict[str, Any]:
    """Tokens per second of forward + backward + Adam (lr 1e-3) on random tokens for a transformer preset."""
    config = preset(config_name)
    if seq > config.context:
        raise ValueError(f"seq {seq} exceeds the context {config.context} of preset {config_name!r}")
    model = Transformer(config, seed=seed)
    optimizer = Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, size=(batch, seq + 1))
    loss_value = float("nan")

    def step() -> float:
        return lm_step(model, optimizer, tokens[:, :-1], tokens[:, 1:], clip=0.0).item()

    for _ in range(warmup):
        step()
    step_seconds = []
    cpu_start = time.process_time()
    for _ in range(steps):
        start = time.perf_counter()
        loss_value = step()
        step_seconds.append(time.perf_counter() - start)
    elapsed = sum(step_seconds)
    cpu_seconds = time.process_time() - cpu_start
    return {
        "engine": "runtime (numpy " + np.__version__ + ")",
        "config": config_name,
        "parameters": model.num_parameters(),
        "steps": steps,
        "batch": batch,
        "seq": seq,
        "seconds_per_step": elapsed / steps,
        "tokens_per_second": batch * seq * steps / elapsed,
        "cpu_seconds_per_step": cpu_seconds / steps,  # all threads together
        "best_seconds_per_step": min(step_seconds),  # robust to other load on the machine
        "final_loss": loss_value,
        "peak_rss_mb": peak_rss_mb(),
    }

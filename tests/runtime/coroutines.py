"""Running a coroutine to completion from a test, whatever else runs in the test process.

pytest-playwright keeps an event loop running in the main thread for the rest of the session once a browser
test has run, so ``asyncio.run`` in a later test fails ("cannot be called from a running event loop"). A
fresh loop in its own thread does not care (the runtime's active backend is process-wide, not per thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_to_completion[T](coroutine: Coroutine[Any, Any, T]) -> T:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()

"""Where the checkout is: the relay serves ``web/`` and ``wheels/`` from it and starts child processes in it."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

"""``python -m server.cli``: the ``peertrain`` command."""

from __future__ import annotations

from server.cli import main

raise SystemExit(main())

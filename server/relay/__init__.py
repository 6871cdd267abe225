"""The relay: the Starlette app (``app``), its endpoints (``endpoints``), the state they share (``state``), the
SQLite store (``sqlite_store``), static files (``static``) and the Python client of its HTTP API (``client``)."""

"""The relay: the Starlette app (``app``), its endpoints (``endpoints``), the state they share (``state``), the
store (``store``: a protocol, SQLite by default), static files (``static``) and the Python client of its HTTP API
(``client``)."""

"""peertrain's host side, in sub-packages by concept; dependencies run one way (cli -> relay / session -> runtime).

- ``server.relay``: the Starlette app, its endpoints, the relay's state, the SQLite store, static files.
- ``server.session``: the round loop, its config, checkpoint files, task packages, the simulator.
- ``server.cli``: the ``peertrain`` command, one module per command.
- ``server.browser``: Debian's Chromium, headless peers, launching a relay process.
- ``server.browser_assets``: the Pyodide packages and wheels a browser installs.
- ``server.bench``: the benchmarks (``peertrain bench``).
"""

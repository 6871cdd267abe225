"""What benches and tests drive a real relay with: ``relay_process`` (``peertrain serve`` in a child process: start,
its URL and admin token, stop, SIGKILL, restart), started with a ``serve_command`` (the settings as objects), and
``native_peer`` (the browser worker's loop, natively, on the relay's Python client and ``runtime.peer.Peer``, with
hooks for attackers, retries and stop conditions)."""

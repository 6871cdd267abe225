"""What benches and tests drive a real relay with: ``relay_process`` (``peertrain serve`` in a child process: start,
its URL and admin token, stop, SIGKILL, restart), started with a ``serve_command`` (the settings as objects), and
``peer`` (the one Python peer: the protocol's steps written once over a synchronous or an asynchronous transport,
with hooks for attackers, retries and stop conditions, and the training simulated peers share), which
``native_peer`` runs in a thread as the browser worker's loop."""

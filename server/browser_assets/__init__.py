"""What a browser installs: the verified Pyodide packages (``assets``), and the wheels with their lock file
(``wheels``); and the host's copy of the browser's engine that replays units with them (``engines``)."""

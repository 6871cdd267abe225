"""What a browser installs: the verified Pyodide packages (``assets``) and the wheels with the lock file (``wheels``)."""

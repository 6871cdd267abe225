"""What a browser installs: the verified Pyodide packages (``assets``), and the wheels with their lock file
(``wheels``)."""

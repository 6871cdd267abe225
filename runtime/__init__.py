"""peertrain runtime: the Python every peer runs (CPython and Pyodide). numpy + stdlib only."""

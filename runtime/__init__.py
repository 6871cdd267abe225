"""peertrain runtime: the Python every peer runs (CPython and Pyodide). numpy + stdlib only."""

__version__ = "0.1.0"

"""Simulated sessions: the in-process simulator, slow and vanishing peers on a virtual clock, local-data
simulation and sweeps of many sessions on a process pool or Ray. Above both the relay and the session."""

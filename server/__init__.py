"""peertrain host side: relay, store, packaging, simulator, CLI."""

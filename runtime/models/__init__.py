"""Models every peer can build from a JSON config: the GPT-style Transformer and the MLP policy."""

from __future__ import annotations

from runtime.models.mlp import MLPConfig, MLPPolicy
from runtime.models.transformer import IGNORE_INDEX, PRESETS, Transformer, TransformerConfig, preset

__all__ = ["IGNORE_INDEX", "MLPConfig", "MLPPolicy", "PRESETS", "Transformer", "TransformerConfig", "preset"]

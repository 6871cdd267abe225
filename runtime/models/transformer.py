"""A GPT-style decoder-only transformer (after nanoGPT's model.py), built on runtime.autograd.

Reads top to bottom: the config, the attention, the MLP, the block, the model, then the presets.
Pre-norm blocks x + attn(ln_1(x)), x + mlp(ln_2(x)); learned token and position embeddings; a final
LayerNorm; a language-model head tied to the token embedding or separate.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.autograd import Tensor, functional, no_grad
from runtime.backend import get_backend
from runtime.nn import Dropout, Embedding, LayerNorm, Linear, Module, ModuleList

IGNORE_INDEX = -100  # targets with this value add nothing to the loss (e.g. masked prompt positions)


@dataclass
class TransformerConfig:
    vocab_size: int = 256
    context: int = 64  # block size: the longest sequence the model reads
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms
    tied_head: bool = True  # the output head reuses the token embedding matrix

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig field(s): {unknown}")
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        return cls.from_dict(json.loads(text))


class CausalSelfAttention(Module):
    def __init__(self, config: TransformerConfig, dropout_rng: np.random.Generator) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.dropout_rng = dropout_rng
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v for all heads
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = Dropout(config.dropout, dropout_rng)

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.c_attn(x)  # (B, T, 3C)
        attention_dropout = self.dropout if self.training else 0.0
        y = functional.causal_self_attention(qkv, self.n_head, attention_dropout, self.dropout_rng)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(Module):
    def __init__(self, config: TransformerConfig, dropout_rng: np.random.Generator) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout, dropout_rng)

    def forward(self, x: Tensor) -> Tensor:
        hidden = functional.gelu(self.c_fc(x))  # (B, T, 4C)
        return self.dropout(self.c_proj(hidden))  # (B, T, C)


class Block(Module):
    def __init__(self, config: TransformerConfig, dropout_rng: np.random.Generator) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, dropout_rng)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config, dropout_rng)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(Module):
    """Decoder-only transformer; the same (config, seed) always gives the same initial weights."""

    def __init__(self, config: TransformerConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.dropout_rng = np.random.default_rng([seed, 1])  # shared by every dropout site, seeded apart from init
        self.wte = Embedding(config.vocab_size, config.n_embd)
        self.wpe = Embedding(config.context, config.n_embd)
        self.drop = Dropout(config.dropout, self.dropout_rng)
        self.blocks = ModuleList(Block(config, self.dropout_rng) for _ in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = None if config.tied_head else Linear(config.n_embd, config.vocab_size, bias=False)
        self.initialize(seed)

    def initialize(self, seed: int) -> None:
        """GPT-2 initialisation: normal(0, 0.02) weights, residual projections scaled by 1/sqrt(2 n_layer),
        zero biases, unit LayerNorm weights; drawn in registration order from one generator."""
        rng = np.random.default_rng(seed)
        backend = get_backend()
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, parameter in self.named_parameters():
            if name.endswith(".bias"):
                values = np.zeros(parameter.shape)
            elif ".ln_" in name or name.startswith("ln_f."):
                values = np.ones(parameter.shape)
            else:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                values = rng.normal(0.0, std, size=parameter.shape)
            parameter.data = backend.from_numpy(values, parameter.dtype)
            parameter.grad = None

    def set_dropout_seed(self, seed: int) -> None:
        """Restart the dropout random stream (shared by every dropout site) from `seed`."""
        self.dropout_rng.bit_generator.state = np.random.default_rng([seed, 1]).bit_generator.state

    def forward(self, idx: Any, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) integer tokens -> logits (B, T, vocab); loss is the mean cross-entropy over targets
        (B, T) that are not IGNORE_INDEX, or None without targets."""
        idx = np.asarray(idx)
        batch, length = idx.shape
        if length > self.config.context:
            raise ValueError(f"sequence length {length} exceeds the model context {self.config.context}")
        x = self.wte(idx) + self.wpe(np.arange(length))  # (B, T, C) + (T, C)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight  # (vocab, C)
        logits = functional.linear(x, head)  # (B, T, vocab)
        loss = None if targets is None else functional.cross_entropy(logits, targets, IGNORE_INDEX)
        return logits, loss

    def generate(
        self,
        idx: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        rng: np.random.Generator | None = None,
        stop_token: int | None = None,
    ) -> np.ndarray:
        """Continue idx ((B, T) or (T,)) by up to max_new_tokens tokens in eval mode and without a graph.

        temperature 0 picks the most likely token; temperature > 0 samples from softmax(logits / temperature)
        with `rng`. Once a row emits stop_token it keeps emitting it; generation ends when every row has.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if temperature > 0 and rng is None:
            raise ValueError("sampling with temperature > 0 needs an np.random.Generator")
        tokens = np.asarray(idx, dtype=np.int64)
        single_row = tokens.ndim == 1
        tokens = tokens[None, :] if single_row else tokens
        finished = np.zeros(tokens.shape[0], dtype=bool)
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    logits, _ = self.forward(tokens[:, -self.config.context :])
                    last = logits.numpy()[:, -1, :].astype(np.float64)  # (B, vocab)
                    next_tokens = _pick_tokens(last, temperature, rng)
                    if stop_token is not None:
                        next_tokens = np.where(finished, stop_token, next_tokens)
                        finished |= next_tokens == stop_token
                    tokens = np.concatenate([tokens, next_tokens[:, None]], axis=1)
                    if stop_token is not None and finished.all():
                        break
        finally:
            self.train(was_training)
        return tokens[0] if single_row else tokens


def _pick_tokens(logits: np.ndarray, temperature: float, rng: np.random.Generator | None) -> np.ndarray:
    if temperature == 0.0 or rng is None:
        return np.argmax(logits, axis=-1)
    scaled = logits / temperature
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    cumulative = np.cumsum(probs, axis=-1)
    draws = rng.random(logits.shape[0]) * cumulative[:, -1]  # inverse-CDF sampling, one draw per row
    return np.minimum((cumulative < draws[:, None]).sum(axis=-1), logits.shape[-1] - 1)


PRESETS: dict[str, TransformerConfig] = {
    # 5 layers x 96 wide, no biases, tied head: 584,736 float32 parameters (2.34 MB).
    "bytelm-2.3mb": TransformerConfig(
        vocab_size=256, context=64, n_layer=5, n_head=4, n_embd=96, dropout=0.0, bias=False, tied_head=True
    ),
    # A small model for arithmetic; the tokenizer sets vocab_size through an override.
    "arith": TransformerConfig(
        vocab_size=32, context=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True, tied_head=True
    ),
}


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """A copy of PRESETS[name] with fields replaced by `overrides` (e.g. vocab_size from a tokenizer)."""
    if name not in PRESETS:
        raise ValueError(f"unknown transformer preset {name!r}; known: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)

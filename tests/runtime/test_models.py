"""Models: sizes of the presets, config round-trips, state dicts, determinism, learning and generation."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.autograd import default_dtype, no_grad
from runtime.models import MLPConfig, MLPPolicy, Transformer, TransformerConfig, preset
from runtime.models import mlp as mlp_module
from runtime.optim import Adam

TEXT = b"peertrain: browsers train together."


def tiny_config(**overrides: object) -> TransformerConfig:
    values: dict[str, object] = {"vocab_size": 256, "context": 34, "n_layer": 2, "n_head": 2, "n_embd": 32}
    values.update(overrides)
    return TransformerConfig(**values)  # type: ignore[arg-type]


def text_ids() -> np.ndarray:
    return np.frombuffer(TEXT, dtype=np.uint8).astype(np.int64)


def test_mlp_preset_has_exactly_114_weights_in_registration_order() -> None:
    policy = MLPPolicy(mlp_module.preset("4-16-2"), seed=0)
    assert policy.num_parameters() == 114
    assert [(name, p.shape) for name, p in policy.named_parameters()] == [
        ("layers.0.weight", (16, 4)),
        ("layers.0.bias", (16,)),
        ("layers.1.weight", (2, 16)),
        ("layers.1.bias", (2,)),
    ]
    logits = policy(np.ones((3, 4)))
    assert logits.shape == (3, 2) and logits.dtype == np.float32
    assert MLPConfig.from_json(MLPConfig(sizes=(4, 16, 2)).to_json()) == MLPConfig()


def test_mlp_initialisation_is_deterministic_per_seed() -> None:
    first, again, other = (MLPPolicy(seed=s).state_dict() for s in (3, 3, 4))
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["layers.0.weight"], other["layers.0.weight"])
    assert np.all(np.abs(first["layers.0.weight"]) <= 0.5)  # uniform in +-1/sqrt(4)


def test_bytelm_preset_size_and_names() -> None:
    model = Transformer(preset("bytelm-2.3mb"), seed=0)
    assert model.num_parameters() == 584_736
    assert 560_000 <= model.num_parameters() <= 590_000
    names = [name for name, _ in model.named_parameters()]
    assert names[:4] == ["wte.weight", "wpe.weight", "blocks.0.ln_1.weight", "blocks.0.attn.c_attn.weight"]
    assert names[-1] == "ln_f.weight" and len(names) == len(set(names))


def test_preset_overrides_and_unknown_names() -> None:
    assert preset("arith", vocab_size=19).vocab_size == 19
    assert preset("arith").vocab_size == 32  # the registry itself is not modified
    with pytest.raises(ValueError, match="unknown transformer preset 'nope'"):
        preset("nope")


def test_config_json_round_trip_and_validation() -> None:
    config = tiny_config(dropout=0.1, bias=False, tied_head=False)
    assert TransformerConfig.from_json(config.to_json()) == config
    assert TransformerConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown TransformerConfig field"):
        TransformerConfig.from_dict({**config.to_dict(), "n_embed": 3})
    with pytest.raises(ValueError, match="multiple of n_head"):
        TransformerConfig(n_embd=10, n_head=4)


def test_initialisation_follows_gpt2() -> None:
    model = Transformer(tiny_config(n_layer=8, n_embd=64), seed=1)
    weights = model.state_dict()
    assert np.std(weights["wte.weight"]) == pytest.approx(0.02, rel=0.05)
    assert np.std(weights["blocks.0.mlp.c_proj.weight"]) == pytest.approx(0.02 / 4.0, rel=0.05)
    assert np.all(weights["blocks.3.ln_2.weight"] == 1.0) and np.all(weights["blocks.3.attn.c_proj.bias"] == 0.0)


def test_tied_and_untied_heads() -> None:
    tied = dict(Transformer(tiny_config(), seed=0).named_parameters())
    untied = dict(Transformer(tiny_config(tied_head=False), seed=0).named_parameters())
    assert "lm_head.weight" not in tied
    assert untied["lm_head.weight"].shape == (256, 32)


def test_state_dict_round_trip_and_clear_errors() -> None:
    source, target = Transformer(tiny_config(), seed=0), Transformer(tiny_config(), seed=1)
    state = source.state_dict()
    target.load_state_dict(state)
    state["wte.weight"][:] = 0.0  # the model holds its own copy
    assert all(np.array_equal(v, source.state_dict()[k]) for k, v in target.state_dict().items())
    with pytest.raises(ValueError, match="missing key 'wpe.weight'"):
        target.load_state_dict({k: v for k, v in state.items() if k != "wpe.weight"})
    with pytest.raises(ValueError, match="unexpected key 'extra'"):
        target.load_state_dict({**state, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match="shape mismatch for key 'ln_f.bias'"):
        target.load_state_dict({**state, "ln_f.bias": np.zeros(3)})


def train(config: TransformerConfig, seed: int, steps: int) -> tuple[list[float], dict[str, np.ndarray]]:
    model = Transformer(config, seed=seed)
    optimizer = Adam(model.parameters(), lr=1e-2)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, size=(4, config.context + 1))
    losses = []
    for _ in range(steps):
        _, loss = model(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model.state_dict()


def test_float32_training_is_bit_deterministic_for_a_seed() -> None:
    config = tiny_config(dropout=0.1)
    losses, weights = train(config, seed=5, steps=3)
    again_losses, again_weights = train(config, seed=5, steps=3)
    assert losses == again_losses
    assert all(np.array_equal(weights[k], again_weights[k]) for k in weights)
    assert weights["wte.weight"].dtype == np.float32
    assert train(config, seed=6, steps=1)[0] != losses[:1]


def test_eval_mode_disables_dropout() -> None:
    model = Transformer(tiny_config(dropout=0.5), seed=0)
    ids = text_ids()[None, :10]
    model.eval()
    with no_grad():
        first, second = model(ids)[0].numpy(), model(ids)[0].numpy()
    np.testing.assert_array_equal(first, second)
    model.train()
    with no_grad():
        assert not np.array_equal(model(ids)[0].numpy(), first)


def test_loss_ignores_masked_targets() -> None:
    model = Transformer(tiny_config(), seed=0)
    ids = text_ids()[None, :]
    targets = ids[:, 1:].copy()
    targets[:, :10] = -100
    logits, loss = model(ids[:, :-1], targets)
    rows = logits.numpy()[0, 10:].astype(np.float64)
    log_probs = rows - np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)) - rows.max(1)[:, None]
    expected = -log_probs[np.arange(len(rows)), targets[0, 10:]].mean()
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_whole_model_gradient_matches_finite_differences_in_float64() -> None:
    with default_dtype(np.float64):
        model = Transformer(tiny_config(vocab_size=11, context=5, n_layer=1, n_embd=8, tied_head=False), seed=2)
    ids = np.random.default_rng(0).integers(0, 11, size=(2, 6))
    _, loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()
    rng = np.random.default_rng(1)
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        for flat_index in rng.choice(parameter.data.size, size=2, replace=False):
            index = np.unravel_index(flat_index, parameter.shape)
            original = parameter.data[index]
            values = []
            for shift in (1e-6, -1e-6):
                parameter.data[index] = original + shift
                with no_grad():
                    values.append(model(ids[:, :-1], ids[:, 1:])[1].item())
            parameter.data[index] = original
            numeric = (values[0] - values[1]) / 2e-6
            assert parameter.grad[index] == pytest.approx(numeric, rel=1e-5, abs=1e-9), name


def test_tiny_transformer_memorises_a_sentence() -> None:
    ids = text_ids()
    model = Transformer(tiny_config(), seed=0)
    optimizer = Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        _, loss = model(ids[None, :-1], ids[None, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.05
    assert bytes(model.generate(ids[:1], len(ids) - 1).astype(np.uint8)) == TEXT


def test_generation_greedy_sampling_stop_token_and_long_prompts() -> None:
    model = Transformer(tiny_config(context=8), seed=3)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    greedy = model.generate(prompt, 12)
    assert greedy.shape == (2, 15) and np.array_equal(greedy[:, :3], prompt)
    assert np.array_equal(greedy, model.generate(prompt, 12))
    sampled = model.generate(prompt, 12, temperature=1.0, rng=np.random.default_rng(0))
    assert np.array_equal(sampled, model.generate(prompt, 12, temperature=1.0, rng=np.random.default_rng(0)))
    assert not np.array_equal(sampled, greedy)
    stop = int(greedy[0, 3])  # the first greedy token of row 0
    stopped = model.generate(prompt[:1], 12, stop_token=stop)
    assert stopped.shape == (1, 4) and stopped[0, -1] == stop
    assert model.generate(np.arange(20) % 256, 2).shape == (22,)  # prompt longer than the context is cropped
    assert model.training
    with pytest.raises(ValueError, match="Generator"):
        model.generate(prompt, 1, temperature=0.5)


def test_throughput_measurement_reports_tokens_per_second() -> None:
    from runtime.bench_step import train_steps_throughput

    result = train_steps_throughput("arith", steps=2, batch=2, seq=8, seed=0, warmup=0)
    assert result["parameters"] == Transformer(preset("arith"), seed=0).num_parameters()
    assert result["tokens_per_second"] > 0 and np.isfinite(result["final_loss"])
    with pytest.raises(ValueError, match="exceeds the context"):
        train_steps_throughput("arith", steps=1, seq=33)

"""Models that leave a session in standard formats (``peertrain export``, ``GET /api/admin/export/model``).

- **safetensors**: one tensor per parameter under the model's own names (``wte.weight``, ``blocks.0.attn.c_attn.
  weight``, ...: nanoGPT's layout, Linear weights as (out, in)), float32, with the metadata a loader needs:
  ``spec`` (names and shapes in order), ``model_config``, ``task`` (import name and settings), ``round``,
  ``tokenizer`` (the task's vocabulary as JSON, when it has one) and ``fingerprint``. Beside it ``config.json``
  holds the same in plain JSON.
- **hf** (transformer tasks): a Hugging Face GPT-2 folder that ``transformers.GPT2LMHeadModel.from_pretrained``
  loads: ``config.json`` (``model_type`` gpt2, tanh GELU, LayerNorm eps 1e-5, no dropout), ``model.safetensors``
  in GPT-2's names and layout (Conv1D weights are (in, out), so ours are transposed; zero biases where our model
  has none; the head tied to the embedding as ours is), and a ``tokenizer.json`` written with the ``tokenizers``
  library: our character vocabulary (with its BPE merges, if any) as a ``models.BPE`` with no pre-tokenizer, which
  is how ``runtime.data.tokenizer`` encodes, or the 256 byte values as a byte-level BPE with no merges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save, save_file

from runtime.weights import WeightSpec

FORMATS = ("safetensors", "hf")


class ExportError(ValueError):
    """The model cannot be exported as asked; the message says why."""


def named_tensors(spec: WeightSpec, vector: np.ndarray) -> dict[str, np.ndarray]:
    """The flat weights vector as one contiguous float32 array per parameter, under the spec's names."""
    vector = np.asarray(vector, dtype=np.float32)
    if vector.shape != (spec.size,):
        raise ExportError(f"a weights vector of shape {vector.shape} does not fit spec of size {spec.size}")
    return {name: np.ascontiguousarray(vector[start:stop].reshape(shape))
            for (name, shape), start, stop in zip(spec.entries, spec.offsets[:-1], spec.offsets[1:], strict=True)}


def flat_vector(spec: WeightSpec, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """The inverse of ``named_tensors`` (bit for bit)."""
    missing = [name for name in spec.names if name not in tensors]
    if missing:
        raise ExportError(f"the file lacks parameter(s) {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    parts = []
    for name, shape in spec.entries:
        array = np.asarray(tensors[name])
        if tuple(array.shape) != tuple(shape) or array.dtype != np.float32:
            raise ExportError(f"{name}: {array.dtype}{tuple(array.shape)}, expected float32{tuple(shape)}")
        parts.append(array.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def model_metadata(*, spec: WeightSpec, task_info: Mapping[str, Any], model_config: Mapping[str, Any],
                   round_index: int, fingerprint: str, privacy: Mapping[str, Any] | None = None) -> dict[str, str]:
    """What travels with the tensors (safetensors metadata values are strings); ``privacy``: the session's
    differential privacy for these weights (``server.session.privacy.of_weights``)."""
    assets = task_info.get("assets") or {}
    metadata = {"format": "peertrain", "spec": json.dumps(spec.to_json()), "model_config": json.dumps(model_config),
                "task": json.dumps({"task_import": task_info.get("task_import"),
                                    "settings": task_info.get("settings")}),
                "round": str(round_index), "fingerprint": fingerprint}
    if privacy is not None:
        metadata["privacy"] = json.dumps(privacy)
    if isinstance(assets.get("tokenizer"), str):
        metadata["tokenizer"] = assets["tokenizer"]
    return metadata


def metadata_of(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file in memory (an 8-byte length, then the JSON header)."""
    if len(blob) < 8:
        raise ExportError("not a safetensors file: shorter than its header length")
    length = int.from_bytes(blob[:8], "little")
    try:
        header = json.loads(blob[8:8 + length])
    except ValueError as error:
        raise ExportError(f"not a safetensors file: {error}") from error
    return dict(header.get("__metadata__") or {})


def exported_weights(blob: bytes) -> np.ndarray:
    """The flat weights vector of an exported ``model.safetensors`` (its spec is in the metadata)."""
    from safetensors.numpy import load

    metadata = metadata_of(blob)
    if "spec" not in metadata:
        raise ExportError("the file has no spec in its metadata: not a peertrain export")
    return flat_vector(WeightSpec.from_json(json.loads(metadata["spec"])), load(blob))


def safetensors_bytes(weights: np.ndarray, metadata: Mapping[str, str]) -> bytes:
    spec = WeightSpec.from_json(json.loads(metadata["spec"]))
    return save(named_tensors(spec, weights), metadata=dict(metadata))


def write_safetensors(out: Path, weights: np.ndarray, metadata: Mapping[str, str]) -> list[Path]:
    """``model.safetensors`` (named tensors) and ``config.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    spec = WeightSpec.from_json(json.loads(metadata["spec"]))
    save_file(named_tensors(spec, weights), str(out / "model.safetensors"), metadata=dict(metadata))
    config = {key: json.loads(value) if key in ("spec", "model_config", "task", "tokenizer") else value
              for key, value in metadata.items()}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return [out / "model.safetensors", out / "config.json"]


# -- Hugging Face GPT-2 -----------------------------------------------------------------------------
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def gpt2_tensors(tensors: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Our transformer's tensors in GPT-2's names and layout."""
    n_embd, n_layer = int(config["n_embd"]), int(config["n_layer"])
    out: dict[str, np.ndarray] = {"transformer.wte.weight": tensors["wte.weight"],
                                  "transformer.wpe.weight": tensors["wpe.weight"]}
    zeros = {"ln_1": n_embd, "ln_2": n_embd, "attn.c_attn": 3 * n_embd, "attn.c_proj": n_embd,
             "mlp.c_fc": 4 * n_embd, "mlp.c_proj": n_embd}
    for layer in range(n_layer):
        ours, theirs = f"blocks.{layer}.", f"transformer.h.{layer}."
        for part, width in zeros.items():
            weight = tensors[ours + part + ".weight"]
            out[theirs + part + ".weight"] = np.ascontiguousarray(weight.T) if (part + ".weight") in TRANSPOSED \
                else weight
            out[theirs + part + ".bias"] = tensors.get(ours + part + ".bias", np.zeros(width, np.float32))
    out["transformer.ln_f.weight"] = tensors["ln_f.weight"]
    out["transformer.ln_f.bias"] = tensors.get("ln_f.bias", np.zeros(n_embd, np.float32))
    if not config.get("tied_head", True):
        out["lm_head.weight"] = tensors["lm_head.weight"]
    return {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in out.items()}


def gpt2_config(config: Mapping[str, Any], eos_id: int | None) -> dict[str, Any]:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": int(config["vocab_size"]),
            "n_positions": int(config["context"]), "n_ctx": int(config["context"]), "n_embd": int(config["n_embd"]),
            "n_layer": int(config["n_layer"]), "n_head": int(config["n_head"]), "n_inner": 4 * int(config["n_embd"]),
            "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "scale_attn_weights": True,
            "tie_word_embeddings": bool(config.get("tied_head", True)),
            "bos_token_id": eos_id, "eos_token_id": eos_id, "torch_dtype": "float32"}


def hf_tokenizer(vocab_json: str | None, vocab_size: int) -> tuple[Any, int | None]:
    """A ``tokenizers.Tokenizer`` that encodes as ours does, and the end-of-text id (None: none)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    if vocab_json is None:  # bytes as tokens (bytetext): a byte-level BPE without merges, id = byte value
        if vocab_size != 256:
            raise ExportError(f"a task without a tokenizer must have 256 byte tokens, this one has {vocab_size}")
        alphabet = ByteLevel.alphabet()
        byte_chars = _bytes_to_unicode()
        assert set(byte_chars.values()) == set(alphabet)
        tokenizer = Tokenizer(models.BPE(vocab={byte_chars[b]: b for b in range(256)}, merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer, None
    ours = json.loads(vocab_json)
    vocab = {token: index for index, token in enumerate(ours["vocab"])}
    merges = [tuple(pair) for pair in ours.get("merges", [])]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tokenizer.decoder = decoders.Fuse()  # tokens are pieces of text: decoding joins them as they are
    specials = list(ours.get("special_tokens", []))
    tokenizer.add_special_tokens(specials)
    tokenizer.encode_special_tokens = not ours.get("split_special_tokens", True)
    eos = ours.get("eos_token") or next((s for s in specials if "eos" in s.lower()), None)
    return tokenizer, (vocab[eos] if eos in vocab else None)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table (the one ``tokenizers``' ByteLevel uses)."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(visible), 0
    for byte in range(256):
        if byte not in visible:
            visible.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(visible, chars, strict=True)}


def write_hf(out: Path, weights: np.ndarray, metadata: Mapping[str, str]) -> list[Path]:
    """The GPT-2 folder (module docstring)."""
    config = json.loads(metadata["model_config"])
    if not {"n_layer", "n_head", "n_embd", "context", "vocab_size"} <= set(config):
        raise ExportError("--format hf is for transformer tasks; this model's config has no n_layer/n_head/n_embd "
                          "(use --format safetensors)")
    spec = WeightSpec.from_json(json.loads(metadata["spec"]))
    tokenizer, eos_id = hf_tokenizer(metadata.get("tokenizer"), int(config["vocab_size"]))
    out.mkdir(parents=True, exist_ok=True)
    save_file(gpt2_tensors(named_tensors(spec, weights), config), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(gpt2_config(config, eos_id), indent=1) + "\n")
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"eos_token": tokenizer.id_to_token(eos_id)} if eos_id is not None else {}
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "model_max_length": int(config["context"]),
                                                           **special}, indent=1) + "\n")
    return [out / "config.json", out / "model.safetensors", out / "tokenizer.json", out / "tokenizer_config.json"]


def write_export(out: Path, weights: np.ndarray, metadata: Mapping[str, str], fmt: str) -> list[Path]:
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {FORMATS}, got {fmt!r}")
    return write_hf(out, weights, metadata) if fmt == "hf" else write_safetensors(out, weights, metadata)

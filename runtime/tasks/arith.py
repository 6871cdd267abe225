"""Arithmetic with a small causal transformer: ``37+48=85<eos>``, scored on exact answers.

The transformer LM task (``runtime.tasks.lm_task.LMTask``: the model, the local recipe, training, the probe) on
generated problems: the task gives the tokens (a tokenizer sets the vocabulary), whole shuffled passes over a chunk
with a warm-up and cosine learning rate, and judges the answers.

A known pitfall is built in: a byte-pair tokenizer trained on arithmetic glues digits to operators
(``"7+4"``, ``"8=8"``) and the model never learns the sums; a character vocabulary with a real ``<eos>``
(``tokenizer="char"``, the default) does. ``inspect_lines()`` shows how the tokenizer cuts a few examples and
warns about glued tokens.

Data (``runtime.data.arith``, all seeded by ``seed``): ``num_examples`` training problems on the training pairs,
one-digit operands more often than uniform draws give (``width_balance``), cut into ``chunks`` work units. Each
chunk is one int32 array of shape ``(2, N, T)``: ``chunk[0]`` the inputs (token ids, right-padded with ``<pad>``),
``chunk[1]`` the next-token targets, -100 wherever the loss does not look (prompt and padding: the loss covers
only the answer and the end marker). ``T`` is the longest training or validation sequence minus one, not the
model's context, so no step is spent on padding.

Validation (kept on the host): ``val_*`` the 200 seeded problems drawn uniformly from the whole range (every pair
equally likely; a measure of fit: they may overlap the training problems), ``gen_*`` problems never trained on
(held-out pairs, then ``beyond_range_size`` three-digit ones, marked by ``gen_beyond``), ``sample_*`` the
problems shown as samples (one-digit, two-digit and held-out pairs in turn; ``sample_heldout`` marks the
held-out ones). Each set is ``*_prompts`` (M, P) int32 right-padded, ``*_lengths`` (M,) and ``*_answers`` (M,)
int64; ``loss_inputs`` / ``loss_targets`` are the validation problems as LM arrays for ``val_loss``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.data.arith import (
    ArithSettings,
    Problem,
    char_tokenizer,
    chunk_problems,
    generalization_problems,
    generate_problems,
    make_lm_examples,
    make_problem,
    parse_answer,
    sample_problems,
    split_pairs,
    validation_problems,
)
from runtime.data.tokenizer import Tokenizer, TokenizerError, inspect_tokenization, tokenization_warning
from runtime.models.transformer import Transformer, TransformerConfig, preset
from runtime.tasks.base import HostServices, Sample, TaskData, TaskError, WorkUnit
from runtime.tasks.lm import greedy_continuations, mean_loss, pass_batches, warmup_cosine
from runtime.tasks.lm_recipe import LMRecipe, recipe_default
from runtime.tasks.lm_task import LMTask
from runtime.tasks.settings import setting

TOKENIZERS = ("char", "bpe")
MODEL_OVERRIDES = ("n_layer", "n_head", "n_embd", "context")
SAMPLE_COUNT = 6  # the page's samples: two one-digit pairs, two two-digit pairs, two held-out pairs
SIZE = "None: the preset's"


@dataclass(frozen=True, kw_only=True)
class ArithTaskSettings(LMRecipe):
    """The recipe (``runtime.tasks.lm_recipe.LMRecipe``) with arith's own preset, batch and ``steps``, the problems,
    the tokenizer, the model's sizes, and whole passes over a chunk with a warm-up and cosine learning rate."""

    # -- the problems (runtime.data.arith.ArithSettings checks them)
    operand_min: int = field(default=0, metadata=setting(help="the smallest operand"))
    operand_max: int = field(default=99, metadata=setting(help="the largest operand"))
    operators: tuple[str, ...] = field(default=("+",), metadata=setting(help="the operators, of + - *"))
    num_examples: int = field(default=10_000, metadata=setting(help="training problems"))
    chunks: int = field(default=8, metadata=setting(help="work units the training problems are cut into"))
    seed: int = field(default=0, metadata=setting(help="seeds the problems and the held-out pairs"))
    width_balance: float = field(default=0.4, metadata=setting(
        help="the share of training operands drawn digit count first, the rest uniform over the range (0.4: "
             "two one-digit operands in 6.8 % of the problems; 0: in 1 %; 1: one- and two-digit operands "
             "equally often)",
        minimum=0, maximum=1))
    heldout_fraction: float = field(default=0.1, metadata=setting(
        help="the share of operand pairs never trained on (the gen_* scores)"))
    validation_size: int = field(default=200, metadata=setting(help="validation problems from the whole range"))
    generalization_size: int = field(default=200, metadata=setting(help="problems on the held-out pairs"))
    beyond_range_size: int = field(default=50, metadata=setting(help="three-digit problems beyond the range"))
    # -- the tokenizer
    tokenizer: str = field(default="char", metadata=setting(
        help="char (every character a token, a real <eos>) or bpe (glues digits and operators: no sums)",
        choices=TOKENIZERS))
    merges: int = field(default=300, metadata=setting(help="bpe only: the merges it learns", minimum=0))
    glue_end_marker: bool = field(default=True, metadata=setting(
        help="bpe only: \"<eos>\\n\" written as text the merges can fuse with the last digit"))
    # -- the model: a preset, with optional sizes
    model: str = recipe_default("model", "arith")
    n_layer: int | None = field(default=None, metadata=setting(help=f"transformer blocks; {SIZE}", minimum=1))
    n_head: int | None = field(default=None, metadata=setting(help=f"attention heads; {SIZE}", minimum=1))
    n_embd: int | None = field(default=None, metadata=setting(help=f"embedding width; {SIZE}", minimum=1))
    context: int | None = field(default=None, metadata=setting(help=f"tokens a sequence holds; {SIZE}", minimum=1))
    # -- local training per unit: `epochs` shuffled passes over the chunk (or exactly `steps` batches when > 0)
    epochs: int = field(default=1, metadata=setting(help="shuffled passes over the chunk per unit", minimum=1))
    steps: int = field(default=0, metadata=setting(
        help="exactly this many batches per unit (from as many shuffled passes as needed); 0: `epochs` passes",
        minimum=0))
    batch_size: int = recipe_default("batch_size", 32)
    warmup: int = field(default=10, metadata=setting(
        help="steps of linear warm-up at the start of each unit (a fresh optimizer per unit)", minimum=0))
    final_lr_ratio: float = field(default=0.1, metadata=setting(
        help="cosine decay to lr * this at the unit's last step", minimum=0, maximum=1))
    session_final_lr_ratio: float = field(default=0.1, metadata=setting(
        help="and across the session: lr * this by its last round (1: no decay)", above=0, maximum=1))

    def __post_init__(self) -> None:
        object.__setattr__(self, "operators", tuple(self.operators))
        super().__post_init__()  # (the declared bounds, the recipe's rule)
        self.arith()  # ArithSettings checks the problem settings (operators, operand range, chunks)
        self.base_config()

    def arith(self) -> ArithSettings:
        fields = {f.name for f in dataclasses.fields(ArithSettings)} - {"end_token"}
        return ArithSettings(**{name: getattr(self, name) for name in fields})

    def base_config(self) -> TransformerConfig:
        overrides = {name: getattr(self, name) for name in MODEL_OVERRIDES if getattr(self, name) is not None}
        try:
            return preset(self.model, **overrides)
        except (ValueError, TypeError) as error:
            raise ValueError(f"setting model={self.model!r} with overrides {overrides}: {error}") from error


def encode_prompts(tokenizer: Tokenizer, problems: list[Problem], prefix: str) -> dict[str, np.ndarray]:
    """``{prefix}_prompts`` (M, P) int32 right-padded, ``{prefix}_lengths`` (M,), ``{prefix}_answers`` (M,) int64."""
    encoded = [tokenizer.encode(p.prompt) for p in problems]
    width = max((len(ids) for ids in encoded), default=1)
    prompts = np.full((len(problems), width), tokenizer.pad_id, dtype=np.int32)
    for row, ids in enumerate(encoded):
        prompts[row, : len(ids)] = ids
    return {
        f"{prefix}_prompts": prompts,
        f"{prefix}_lengths": np.array([len(ids) for ids in encoded], dtype=np.int32),
        f"{prefix}_answers": np.array([int(p.answer) for p in problems], dtype=np.int64),
    }


class ArithTask(LMTask):
    name = "arith"
    kind = "data"
    metric = "val_loss"
    plot_metric = "accuracy"  # exact answers: what matters for arithmetic
    respond_hint = "37+48="
    # A native peer's unit replayed on the browser's engine (or a WebGPU unit) parts by the last bits of each step,
    # and ~117 Adam steps (3 epochs of a default chunk) amplify them: an honest native unit deviated 0.019 of its
    # update (2026-12-05; 21-step units up to 1.2e-03), past the default 1e-2, and its peer was banned. 0.05 keeps
    # 10x from every attack of ``bench attacks`` (0.5 to 5; a noise attacker 2.3); browsers' CPU units match exactly.
    replay_rtol = 0.05
    Settings = ArithTaskSettings
    settings: ArithTaskSettings

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(settings)
        self.tokenizer: Tokenizer | None = None
        if self.settings.tokenizer == "char":
            self.tokenizer = char_tokenizer(self.settings.arith())

    # -- what peers get -------------------------------------------------------------------------
    def crosses_boundary(self) -> str:
        s = self.settings
        return (f"Peers receive one chunk of generated arithmetic problems per assignment (about "
                f"{s.num_examples // s.chunks} problems such as 37+48=85, as token ids), the {s.tokenizer} "
                "tokenizer's vocabulary and the model weights. The problems are synthetic; the validation and "
                "generalisation problems stay on the host.")

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise TaskError("arith: the bpe tokenizer is made by prepare(); call attach(assets) first")
        return self.tokenizer

    def base_config(self) -> TransformerConfig:
        return self.settings.base_config()

    def vocab_size(self) -> int:
        return self.require_tokenizer().vocab_size

    def attach(self, assets: Mapping[str, Any]) -> None:
        if "tokenizer" in assets:
            try:
                self.tokenizer = Tokenizer.from_json(assets["tokenizer"])
            except (TokenizerError, KeyError, TypeError, ValueError) as error:
                raise TaskError(f"arith: cannot restore the tokenizer: {error}") from error
            self._model = None  # the vocabulary may differ from the one a model was built for

    # -- host side ------------------------------------------------------------------------------
    def make_tokenizer(self, problems: list[Problem], host: HostServices | None) -> Tokenizer:
        if self.settings.tokenizer == "char":
            return char_tokenizer(self.settings.arith())
        if host is None or host.train_bpe is None:
            raise TaskError("arith: tokenizer='bpe' needs the host's train_bpe service "
                            "(server.session.bpe.train_for_task); use tokenizer='char' inside a peer")
        tokenizer = host.train_bpe(problems, self.settings.merges, glue_end_marker=self.settings.glue_end_marker)
        if not isinstance(tokenizer, Tokenizer):
            raise TaskError(f"arith: train_bpe returned {type(tokenizer).__name__}, expected a runtime Tokenizer")
        return tokenizer

    def prepare(self, host: HostServices | None = None) -> TaskData:
        arith = self.settings.arith()
        problems = generate_problems(arith)
        tokenizer = self.make_tokenizer(problems, host)
        val = validation_problems(arith)
        general = generalization_problems(arith)
        shown, shown_heldout = sample_problems(arith, SAMPLE_COUNT)
        try:
            steps = max(len(tokenizer.pieces(p.text(tokenizer.end_text))) for p in problems + val) - 1
            context = self.settings.base_config().context
            if steps > context:
                raise TaskError(f"arith: problems need {steps} positions; setting context={context} is too small")
            chunks = []
            for part in chunk_problems(problems, arith.chunks):
                inputs, targets = make_lm_examples(tokenizer, part, steps)
                chunks.append(np.stack([inputs, targets]))  # (2, N, T)
            loss_inputs, loss_targets = make_lm_examples(tokenizer, val, steps)
            validation = {"loss_inputs": loss_inputs, "loss_targets": loss_targets}
            validation |= encode_prompts(tokenizer, val, "val")
            validation |= encode_prompts(tokenizer, general, "gen")
            validation |= encode_prompts(tokenizer, shown, "sample")
        except TokenizerError as error:
            raise TaskError(f"arith: the tokenizer cannot encode the problems: {error}") from error
        _, heldout = split_pairs(arith)
        validation["gen_beyond"] = np.array([i >= min(len(heldout), arith.generalization_size)
                                             for i in range(len(general))], dtype=np.int32)
        validation["sample_heldout"] = np.array(shown_heldout, dtype=np.int32)
        return TaskData(num_units=len(chunks), units=chunks, validation=validation,
                        assets={"tokenizer": tokenizer.to_json()})

    def inspect_lines(self) -> list[str]:
        """How the tokenizer cuts ``37+48=85`` and a few validation problems, then the warning if tokens glue."""
        tokenizer = self.require_tokenizer()
        arith = self.settings.arith()
        examples = [make_problem(37, arith.operators[0], 48)] + validation_problems(arith)[:3]
        lines = [f"tokenizer: {self.settings.tokenizer}, {tokenizer.vocab_size} tokens, "
                 f"{len(tokenizer.merges)} merges"]
        lines += inspect_tokenization(tokenizer, [p.text(tokenizer.end_text) for p in examples])
        warning = tokenization_warning(tokenizer)
        lines.append(warning or "tokenizer check: every digit, operator and '=' is its own token; <eos> is real")
        return lines

    # -- peer side ------------------------------------------------------------------------------
    def unit_examples(self, unit: WorkUnit) -> int:
        """A chunk is (2, N, T): inputs and targets of N problems."""
        return int(unit.data.shape[1]) if unit.data is not None and unit.data.ndim == 3 else 0

    def unit_tokens(self, unit: WorkUnit) -> tuple[np.ndarray, np.ndarray, int]:
        data = unit.data
        if data is None or data.ndim != 3 or data.shape[0] != 2:
            shape = None if data is None else list(data.shape)
            raise TaskError(f"arith: a unit needs a (2, N, T) int32 chunk of inputs and targets, got {shape}")
        return data[0], data[1], int(data.shape[1])

    def batch_plan(self, count: int, rng: np.random.Generator) -> list[np.ndarray]:
        """``epochs`` shuffled passes over the chunk's problems, or exactly ``steps`` batches when > 0."""
        s = self.settings
        return pass_batches(count, s.batch_size, epochs=s.epochs, steps=s.steps, rng=rng)

    def lr_schedule(self, unit: WorkUnit, steps: int) -> Callable[[int], float]:
        """A linear warm-up, then a cosine down to ``final_lr_ratio`` over the unit, from a peak that follows a
        cosine over the session down to ``session_final_lr_ratio``."""
        s = self.settings
        # Each unit starts a fresh optimizer at full speed; a cosine over the session's progress keeps late rounds
        # from shaking an answer set the model has already learnt.
        session_scale = s.session_final_lr_ratio + (1 - s.session_final_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * min(1.0, max(0.0, unit.progress))))
        return warmup_cosine(s.lr * session_scale, steps, warmup=s.warmup, final_lr_ratio=s.final_lr_ratio)

    # -- validation -----------------------------------------------------------------------------
    def answers(self, model: Transformer, validation: Mapping[str, np.ndarray], prefix: str) -> list[str]:
        """Greedy answers to the ``prefix`` set's prompts (decoded up to the end marker)."""
        tokenizer = self.require_tokenizer()
        truth = validation[f"{prefix}_answers"]
        if len(truth) == 0:
            return []
        longest = max(len(str(int(a))) for a in truth) + 1  # the answer's characters and an end marker
        room = model.config.context - int(validation[f"{prefix}_lengths"].max())
        generated = greedy_continuations(model, validation[f"{prefix}_prompts"], validation[f"{prefix}_lengths"],
                                         max(1, min(longest, room)), stop_token=tokenizer.eos_id)
        return [parse_answer(tokenizer, ids) for ids in generated]

    def validate(self, weights: np.ndarray, validation: Mapping[str, np.ndarray]) -> dict[str, float]:
        model = self.load(weights)
        loss = mean_loss(model, validation["loss_inputs"], validation["loss_targets"])
        val_ok = self.correct(model, validation, "val")
        gen_ok = self.correct(model, validation, "gen")
        beyond = validation["gen_beyond"].astype(bool)
        return {
            "val_loss": loss,
            "accuracy": float(val_ok.mean()) if val_ok.size else 0.0,
            "correct": float(val_ok.sum()),
            "generalization_accuracy": float(gen_ok.mean()) if gen_ok.size else 0.0,
            "heldout_accuracy": float(gen_ok[~beyond].mean()) if (~beyond).any() else 0.0,
            "beyond_range_accuracy": float(gen_ok[beyond].mean()) if beyond.any() else 0.0,
        }

    def correct(self, model: Transformer, validation: Mapping[str, np.ndarray], prefix: str) -> np.ndarray:
        truth = validation[f"{prefix}_answers"]
        answers = self.answers(model, validation, prefix)
        return np.array([a == str(int(t)) for a, t in zip(answers, truth, strict=True)], dtype=bool)

    def respond(self, weights: np.ndarray, prompt: str) -> dict[str, Any]:
        """The greedy answer to a problem such as ``37+48=`` (up to the end marker)."""
        tokenizer = self.require_tokenizer()
        text = prompt.strip()
        if not text:
            raise TaskError("type a problem such as 37+48=")
        text = text if text.endswith("=") else text + "="
        try:
            ids = tokenizer.encode(text)
        except TokenizerError as error:
            raise TaskError(f"the model's vocabulary cannot write {text!r}: {error}") from error
        model = self.load(weights)
        room = model.config.context - len(ids)
        if room < 1:
            raise TaskError(f"the problem is longer than the model's context ({model.config.context} tokens)")
        generated = greedy_continuations(model, np.array([ids]), np.array([len(ids)]), min(room, 8),
                                         stop_token=tokenizer.eos_id)
        return {"text": text + parse_answer(tokenizer, generated[0]), "prompt": text}

    def samples(self, weights: np.ndarray, validation: Mapping[str, np.ndarray], count: int = 6) -> list[Sample]:
        """Lines like ``3+5=8 ok``, ``37+48=84 wrong, want 85`` and ``never trained on: 61+7=68 ok`` for the sample
        problems (``runtime.data.arith.sample_problems``: one-digit, two-digit and held-out pairs in turn)."""
        tokenizer = self.require_tokenizer()
        model = self.load(weights)
        answers = self.answers(model, validation, "sample")
        held_out = validation.get("sample_heldout", np.zeros(len(answers), dtype=np.int32))  # (older packages)
        out = []
        for row, answer in enumerate(answers[:count]):
            prompt = tokenizer.decode(validation["sample_prompts"][row, : validation["sample_lengths"][row]])
            want = str(int(validation["sample_answers"][row]))
            ok = answer == want
            text = f"{prompt}{answer} " + ("ok" if ok else f"wrong, want {want}")
            out.append(Sample(text=("never trained on: " if held_out[row] else "") + text, ok=ok))
        return out

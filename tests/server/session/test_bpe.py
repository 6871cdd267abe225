"""BPE trained with Hugging Face tokenizers on arithmetic text, and its pure-Python runtime export."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

from runtime.data.arith import (  # noqa: E402
    ArithSettings,
    generalization_problems,
    generate_problems,
    make_lm_examples,
    make_problem,
    validation_problems,
)
from runtime.data.tokenizer import EOS, PAD, Tokenizer, glued_tokens, inspect_tokenization  # noqa: E402
from server.session.bpe import (  # noqa: E402
    REPORT_ARITH_SEED,
    REPORT_NUM_EXAMPLES,
    REPORT_NUM_MERGES,
    REPORT_WIDTH_BALANCE,
    BpeSettings,
    train_arith_bpe,
)

REPORT_ARITH = ArithSettings(seed=REPORT_ARITH_SEED, num_examples=REPORT_NUM_EXAMPLES,
                             width_balance=REPORT_WIDTH_BALANCE)


@pytest.fixture(scope="module")
def report_problems() -> list:
    return generate_problems(REPORT_ARITH)


@pytest.mark.parametrize("glue", [True, False])
def test_runtime_encoder_matches_hugging_face(report_problems: list, glue: bool) -> None:
    settings = BpeSettings(num_merges=REPORT_NUM_MERGES, glue_end_marker=glue)
    hf, tok = train_arith_bpe(report_problems, settings)
    assert tok.vocab_size == hf.get_vocab_size()
    texts = [p.text(settings.end_text) for p in report_problems[:500]]
    texts += [p.text(settings.end_text) for p in validation_problems(REPORT_ARITH)[:100]]
    texts += [p.text(settings.end_text) for p in generalization_problems(REPORT_ARITH)]  # incl. three-digit
    texts.append("".join(texts[:20]))  # several lines at once
    for text in texts:
        assert tok.encode(text) == hf.encode(text).ids, text
        assert tok.pieces(text) == hf.encode(text).tokens
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("glue", [True, False])
def test_vocabulary_is_specials_alphabet_and_merges(report_problems: list, glue: bool) -> None:
    settings = BpeSettings(num_merges=120, glue_end_marker=glue)
    hf, tok = train_arith_bpe(report_problems, settings)
    alphabet = set("".join(p.text(settings.end_text) if glue else p.prompt + p.answer for p in report_problems))
    assert tok.vocab[:2] == [PAD, EOS] and tok.eos_id == hf.token_to_id(EOS) == 1
    assert set(tok.vocab[2 : 2 + len(alphabet)]) == alphabet
    assert len(tok.merges) == 120 and tok.vocab_size == 2 + len(alphabet) + 120
    again = Tokenizer.from_json(tok.to_json())
    assert again.merges == tok.merges and again.split_special_tokens == tok.split_special_tokens


def test_reproduces_the_field_reports_cut(report_problems: list) -> None:
    settings = BpeSettings(num_merges=REPORT_NUM_MERGES)
    hf, tok = train_arith_bpe(report_problems, settings)
    text = make_problem(37, "+", 48).text(settings.end_text)
    assert text == "37+48=85<eos>\n"
    assert hf.encode(text).tokens == ["3", "7+4", "8=8", "5<eos>\n"]
    assert inspect_tokenization(tok, [text]) == ['37+48=85<eos> -> "3" | "7+4" | "8=8" | "5<eos>\\n"']
    glued = glued_tokens(tok)
    assert "7+4" in glued and "8=8" in glued
    # the loss mask follows the glued tokens: "8=8" holds an answer digit, so it is a target
    _, targets = make_lm_examples(tok, [make_problem(37, "+", 48)], context=8)
    assert [tok.vocab[t] for t in targets[0] if t >= 0] == ["8=8", "5<eos>\n"]


def test_real_special_token_mode_keeps_eos_apart(report_problems: list) -> None:
    settings = BpeSettings(num_merges=REPORT_NUM_MERGES, glue_end_marker=False)
    hf, tok = train_arith_bpe(report_problems, settings)
    text = make_problem(37, "+", 48).text(settings.end_text)
    assert text == "37+48=85<eos>"
    assert tok.pieces(text)[-1] == EOS and hf.encode(text).ids[-1] == tok.eos_id
    assert glued_tokens(tok)  # digits still glue to operators: only a char vocabulary avoids that
    assert not [t for t in tok.vocab if EOS in t and t != EOS]


def test_few_merges_glue_nothing(report_problems: list) -> None:
    _, tok = train_arith_bpe(report_problems, BpeSettings(num_merges=0, glue_end_marker=False))
    assert tok.merges == [] and glued_tokens(tok) == []


def test_settings_round_trip_through_json() -> None:
    settings = BpeSettings(num_merges=42, glue_end_marker=False, newline=False)
    assert BpeSettings.from_json(settings.to_json()) == settings

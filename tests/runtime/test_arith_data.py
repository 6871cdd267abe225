"""Arithmetic problems, the pure-Python tokenizer, and the causal-LM arrays built from them."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.data.arith import (
    IGNORE_INDEX,
    ArithError,
    ArithSettings,
    Problem,
    arith_alphabet,
    char_tokenizer,
    chunk_problems,
    exact_match,
    generalization_problems,
    generate_problems,
    make_lm_examples,
    make_problem,
    operand_weights,
    parse_answer,
    sample_problems,
    split_pairs,
    validation_problems,
)
from runtime.data.tokenizer import (
    EOS,
    PAD,
    CharTokenizer,
    Tokenizer,
    TokenizerError,
    glued_tokens,
    inspect_tokenization,
    tokenization_warning,
)

SETTINGS = ArithSettings(num_examples=2000, seed=3, operators=("+", "-", "*"), chunks=4)


def test_settings_round_trip_through_json() -> None:
    again = ArithSettings.from_json(SETTINGS.to_json())
    assert again == SETTINGS and again.operators == ("+", "-", "*")
    assert ArithSettings.from_json(ArithSettings().to_json()) == ArithSettings()


def test_settings_are_checked() -> None:
    with pytest.raises(ArithError, match="operators"):
        ArithSettings(operators=("/",))
    with pytest.raises(ArithError, match="operand_min"):
        ArithSettings(operand_min=50, operand_max=10)
    with pytest.raises(ArithError, match="chunks"):
        ArithSettings(num_examples=3, chunks=5)
    with pytest.raises(ArithError, match="width_balance"):
        ArithSettings(width_balance=1.5)


def test_answers_and_format() -> None:
    assert make_problem(37, "+", 48) == Problem(37, "+", 48, "85")
    assert make_problem(37, "+", 48).text() == "37+48=85<eos>"
    assert make_problem(3, "-", 5).text() == "3-5=-2<eos>"
    assert make_problem(12, "*", 11).prompt == "12*11="
    assert make_problem(12, "*", 11).answer == "132"
    for p in generate_problems(SETTINGS):
        assert int(p.answer) == {"+": p.a + p.b, "-": p.a - p.b, "*": p.a * p.b}[p.op]


def test_problems_are_seeded() -> None:
    assert generate_problems(SETTINGS) == generate_problems(SETTINGS)
    other = ArithSettings.from_json(SETTINGS.to_json().replace('"seed": 3', '"seed": 4'))
    assert generate_problems(other) != generate_problems(SETTINGS)
    assert len(generate_problems(SETTINGS)) == 2000
    assert {p.op for p in generate_problems(SETTINGS)} == {"+", "-", "*"}


def test_held_out_pairs_are_disjoint_and_never_trained_on() -> None:
    train, heldout = split_pairs(SETTINGS)
    assert len(train) + len(heldout) == 100 * 100 and len(heldout) == 1000
    assert not set(train) & set(heldout)
    trained_pairs = {(p.a, p.b) for p in generate_problems(SETTINGS)}
    assert trained_pairs <= set(train)
    general = generalization_problems(SETTINGS)
    on_heldout = [p for p in general if p.a <= 99 and p.b <= 99]
    beyond = [p for p in general if p.a > 99]
    assert len(on_heldout) == 200 and len(beyond) == 50
    assert all((p.a, p.b) in set(heldout) for p in on_heldout)
    assert all(100 <= p.a <= 999 and 100 <= p.b <= 999 for p in beyond)  # three-digit problems
    assert generalization_problems(SETTINGS) == general


def test_the_one_digit_table_is_always_trained_and_the_held_out_share_comes_from_the_other_pairs() -> None:
    """Held out at random, 13 of the 100 one-digit sums were never seen (8+0 among them, which the demo's model then
    got wrong); now the pairs of two fewest-digit operands are all trained and the share is drawn from the rest, in
    the same seeded order (so the other held-out pairs stay what they were)."""
    settings = ArithSettings()
    train, heldout = split_pairs(settings)
    table = {(a, b) for a in range(10) for b in range(10)}
    assert table <= set(train) and len(heldout) == 1000 and not set(train) & set(heldout)
    # the same order as a plain seeded draw: every two-digit pair the plain draw held out is still held out
    values = range(100)
    pairs = [(a, b) for a in values for b in values]
    order = np.random.default_rng(np.random.SeedSequence(settings.seed, spawn_key=(0,))).permutation(len(pairs))
    plain = {pairs[i] for i in order[:1000]}
    assert plain - table <= set(heldout) and len(plain & table) == 13
    # other seeds and ranges: the table of the fewest digits (10-99 spans one width: nothing is set apart)
    for seed in range(5):
        train, heldout = split_pairs(ArithSettings(seed=seed))
        assert table <= set(train) and len(heldout) == 1000
    one_width = ArithSettings(operand_min=10, operand_max=49)
    _, heldout = split_pairs(one_width)
    assert len(heldout) == 160 and any(max(pair) < 20 for pair in heldout)
    # a share larger than the other pairs: the table is drawn from too, as before
    _, heldout = split_pairs(ArithSettings(operand_min=0, operand_max=10, heldout_fraction=0.9))
    assert len(heldout) == 109


def test_one_digit_operands_are_drawn_more_often() -> None:
    """Uniform over 0-99 (width_balance=0, the old draws), two one-digit operands were 1 % of the problems (about one
    draw per pair); 40 % of the operands digit count first makes it 6.8 %, every trained one-digit pair often."""
    chance = operand_weights(ArithSettings())
    assert chance.shape == (100,) and chance.sum() == pytest.approx(1.0)
    assert chance[:10] == pytest.approx([0.026] * 10) and chance[10:] == pytest.approx([0.006 + 0.2 / 90] * 90)
    assert operand_weights(ArithSettings(width_balance=0)) == pytest.approx([0.01] * 100)
    even = operand_weights(ArithSettings(width_balance=1))
    assert even[:10].sum() == pytest.approx(0.5) and even[10:].sum() == pytest.approx(0.5)
    assert operand_weights(ArithSettings(operand_min=10, operand_max=49)) == pytest.approx([1 / 40] * 40)

    settings = ArithSettings(num_examples=10_000)
    train, heldout = split_pairs(settings)
    problems = generate_problems(settings)
    one_digit = [p for p in problems if p.a < 10 and p.b < 10]
    assert 0.06 < len(one_digit) / len(problems) < 0.08
    assert 0.25 < sum((p.a < 10) + (p.b < 10) for p in problems) / (2 * len(problems)) < 0.27
    small_train = [pair for pair in train if max(pair) < 10]
    counts = {pair: 0 for pair in small_train}
    for p in one_digit:
        counts[(p.a, p.b)] += 1
    assert min(counts.values()) >= 1 and len(one_digit) / len(counts) > 6  # every one, 6.8 times on average
    assert {(p.a, p.b) for p in problems} <= set(train)  # held-out pairs stay held out
    assert len(small_train) == 100 and not any(max(pair) < 10 for pair in heldout)

    uniform = generate_problems(ArithSettings(num_examples=10_000, width_balance=0))
    assert sum(p.a < 10 and p.b < 10 for p in uniform) / len(uniform) < 0.02
    assert uniform != problems and {(p.a, p.b) for p in uniform} <= set(train)


def test_samples_spread_over_one_digit_two_digit_and_held_out_pairs() -> None:
    settings = ArithSettings()
    train, heldout = split_pairs(settings)
    problems, held = sample_problems(settings, 6)
    assert (problems, held) == sample_problems(settings, 6) and held == [False, False, True] * 2
    assert all(p.a < 10 and p.b < 10 and (p.a, p.b) in set(train) for p in problems[0::3])
    assert all(p.a >= 10 and p.b >= 10 and (p.a, p.b) in set(train) for p in problems[1::3])
    assert all((p.a, p.b) in set(heldout) for p in problems[2::3])
    assert len(set(problems)) == 6 and all(int(p.answer) == p.a + p.b for p in problems)
    # every operator in turn, and a range without held-out pairs shows trained pairs only
    mixed, _ = sample_problems(ArithSettings(operators=("+", "-", "*")), 3)
    assert [p.op for p in mixed] == ["+", "-", "*"]
    _, none_held = sample_problems(ArithSettings(heldout_fraction=0), 4)
    assert none_held == [False] * 4


def test_validation_problems_cover_the_training_range() -> None:
    problems = validation_problems(ArithSettings())
    assert len(problems) == 200 and problems == validation_problems(ArithSettings())
    assert all(0 <= p.a <= 99 and 0 <= p.b <= 99 and p.op == "+" for p in problems)


def test_chunks_are_contiguous_and_equal_ish() -> None:
    problems = generate_problems(SETTINGS)
    chunks = chunk_problems(problems, 7)
    assert [p for chunk in chunks for p in chunk] == problems
    assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_char_tokenizer_keeps_every_character_apart() -> None:
    tok = CharTokenizer.build(arith_alphabet(SETTINGS))
    assert tok.vocab[:2] == [PAD, EOS] and tok.pad_id == 0 and tok.eos_id == 1
    text = "37+48=85<eos>"
    assert tok.pieces(text) == ["3", "7", "+", "4", "8", "=", "8", "5", "<eos>"]
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text)[-1] == tok.eos_id
    assert glued_tokens(tok) == [] and tokenization_warning(tok) is None
    expected = '37+48=85<eos> -> "3" | "7" | "+" | "4" | "8" | "=" | "8" | "5" | "<eos>"'
    assert inspect_tokenization(tok, [text]) == [expected]
    again = Tokenizer.from_json(tok.to_json())
    assert again.vocab == tok.vocab and again.encode(text) == tok.encode(text)
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.encode("3/4")
    with pytest.raises(TokenizerError, match="outside"):
        tok.decode([99])


def test_char_tokenizer_follows_the_settings() -> None:
    tok = char_tokenizer(ArithSettings(operators=("+", "-")))
    assert tok.pieces("3-5=-2<eos>") == ["3", "-", "5", "=", "-", "2", "<eos>"] and tok.end_text == EOS
    newline = char_tokenizer(ArithSettings(end_token="<eos>\n"))
    assert newline.pieces(make_problem(1, "+", 1).text(newline.end_text)) == ["1", "+", "1", "=", "2", "<eos>", "\n"]
    with pytest.raises(ArithError, match="end_token"):
        ArithSettings(end_token="<EOS>")


def glued_bpe() -> Tokenizer:
    """A hand-made BPE with the merges a BPE trained on arithmetic makes: it glues digits to '+', '=' and the
    end marker."""
    chars = list("0123456789+=<eos>\n")
    merges = [("7", "+"), ("7+", "4"), ("8", "="), ("8=", "8"), ("<", "e"), ("<e", "o"), ("<eo", "s")]
    merges += [("<eos", ">"), ("<eos>", "\n"), ("5", "<eos>\n")]
    vocab = [PAD, EOS, *dict.fromkeys(chars), *[a + b for a, b in merges if a + b != EOS]]
    return Tokenizer(vocab=vocab, merges=merges, split_special_tokens=False, end_text="<eos>\n")


def test_bpe_merges_glue_fragments_and_are_flagged() -> None:
    tok = glued_bpe()
    text = "37+48=85<eos>\n"
    assert tok.pieces(text) == ["3", "7+4", "8=8", "5<eos>\n"]
    assert inspect_tokenization(tok, [text]) == ['37+48=85<eos> -> "3" | "7+4" | "8=8" | "5<eos>\\n"']
    assert set(glued_tokens(tok)) == {"7+", "7+4", "8=", "8=8"}
    warning = tokenization_warning(tok)
    assert warning is not None and "7+4" in warning and "end marker" in warning
    split = Tokenizer.from_json(tok.to_json().replace('"split_special_tokens": false', '"split_special_tokens": true'))
    assert split.pieces(text) == ["3", "7+4", "8=8", "5", "<eos>", "\n"]


def test_lm_examples_mask_the_prompt() -> None:
    tok = CharTokenizer.build("0123456789+=")
    problems = [make_problem(37, "+", 48), make_problem(1, "+", 1)]
    inputs, targets = make_lm_examples(tok, problems, context=10)
    assert inputs.dtype == np.int32 and targets.dtype == np.int32 and inputs.shape == targets.shape == (2, 10)
    ids = tok.encode("37+48=85<eos>")
    assert inputs[0, :8].tolist() == ids[:-1] and inputs[0, 8:].tolist() == [tok.pad_id] * 2
    # position 5 holds '=' and predicts '8'; earlier positions predict prompt characters
    assert targets[0].tolist() == [IGNORE_INDEX] * 5 + ids[6:] + [IGNORE_INDEX] * 2
    assert tok.decode(t for t in targets[1] if t != IGNORE_INDEX) == "2<eos>"
    with pytest.raises(ArithError, match="context"):
        make_lm_examples(tok, problems, context=5)


def test_lm_examples_count_tokens_that_straddle_the_equals_sign() -> None:
    tok = glued_bpe()
    inputs, targets = make_lm_examples(tok, [make_problem(37, "+", 48)], context=4)
    ids = [tok.token_id(p) for p in ["3", "7+4", "8=8", "5<eos>\n"]]
    assert inputs[0].tolist() == ids[:3] + [tok.pad_id]
    assert targets[0].tolist() == [IGNORE_INDEX, ids[2], ids[3], IGNORE_INDEX]


def test_parse_answer_and_exact_match() -> None:
    tok = CharTokenizer.build("0123456789+-=")
    assert parse_answer(tok, tok.encode("85<eos>12")) == "85"
    assert parse_answer(tok, np.array(tok.encode("-2<eos>"))) == "-2"
    assert parse_answer(tok, tok.encode("85")) == "85"
    assert parse_answer(glued_bpe(), glued_bpe().encode("8=85<eos>\n")) == "8=85"
    problems = [make_problem(37, "+", 48), make_problem(3, "-", 5)]
    assert exact_match(["85", "-2"], problems) == 1.0 and exact_match(["85", "2"], problems) == 0.5

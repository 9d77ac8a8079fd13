"""Word boosting: the automaton against a brute-force scorer of every token sequence, the
phrase list, and the searches with boosting against references (weight 0, an eager
frame-by-frame greedy search, an exhaustive search of every path)."""

import itertools
import warnings

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding import greedy_decode
from asrkit.decoding.fusion.boosting import (
    Phrase,
    boost_tables,
    load_boost,
    no_boost,
    phrase_sequences,
    read_phrases,
)
from asrkit.decoding.fusion.steps import as_tensors
from asrkit.decoding.fusion.tables import combine
from asrkit.decoding.search.beam import live_slots
from asrkit.decoding.search.front import DecodeOptions, decode_batch, decode_nbest
from asrkit.errors import InputError
from asrkit.tokenizer import BLANK_ID, train_tokenizer
from tests.decoding.conftest import random_features, tiny_transducer
from tests.decoding.search.test_beam import brute_force

TEXTS = ["A CAB AND A BAD CAB", "BAD CABS ABANDON A DAB", "AND CAN A CAB NAB A BAND"] * 8


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    return train_tokenizer(TEXTS, tmp_path_factory.mktemp("tok"), 16, "unigram")


# --- the automaton against brute force ------------------------------------------------


def _piece_bonuses(prefix, sequences):
    """Each piece of `prefix` earns the largest weight of a phrase that starts with the
    prefix up to that piece."""
    return [max((w for s, w in sequences.items() if s[: k + 1] == prefix[: k + 1]), default=0)
            for k in range(len(prefix))]  # fmt: skip


def brute_total(y, sequences):
    """What a finished hypothesis earns: every occurrence of every phrase (overlapping ones
    too), each worth its pieces' bonuses."""
    total = 0.0
    for s in sequences:
        for i in range(len(y) - len(s) + 1):
            if tuple(y[i : i + len(s)]) == s:
                total += sum(_piece_bonuses(s, sequences))
    return total


def brute_running(y, sequences):
    """What a prefix holds while searching: its finished occurrences, plus the pieces of its
    longest suffix that a phrase extends (a proper prefix of some phrase)."""
    extendable = {s[:k] for s in sequences for k in range(1, len(s))}
    open_part = next((tuple(y[i:]) for i in range(len(y)) if tuple(y[i:]) in extendable), ())
    return brute_total(y, sequences) + sum(_piece_bonuses(open_part, sequences))


def _walk(tables, y):
    state, earned, running = 0, 0.0, []
    for token in y:
        earned += float(tables.bonus[state, token])
        state = int(tables.next_state[state, token])
        running.append(earned)
    return state, earned, running


@pytest.mark.parametrize("seed", range(12))
def test_the_automaton_earns_what_brute_force_counts_for_every_sequence(seed):
    rng = np.random.default_rng(seed)
    vocab = 4  # blank + 3 tokens: every sequence up to length 6 is checked
    sequences = {}
    for _ in range(rng.integers(1, 5)):
        length = int(rng.integers(1, 4))
        sequence = tuple(int(t) for t in rng.integers(1, vocab, length))
        sequences[sequence] = float(rng.choice([0.5, 1.0, 2.5]))
    tables = boost_tables(sequences, vocab)
    for length in range(7):
        for y in itertools.product(range(1, vocab), repeat=length):
            state, earned, running = _walk(tables, y)
            for k in range(1, length + 1):
                assert running[k - 1] == pytest.approx(brute_running(y[:k], sequences)), (y, k)
            finished = earned + float(tables.final[state])
            assert finished == pytest.approx(brute_total(y, sequences)), (y, sequences)


def test_a_prefix_alone_earns_nothing_and_blank_changes_nothing():
    tables = boost_tables({(1, 2, 3): 2.0}, vocab_size=5)
    state, earned, running = _walk(tables, (1, 2, 4))
    assert running == [2.0, 4.0, 0.0]  # the pieces, then all taken back
    state, earned, _ = _walk(tables, (1, 2))
    assert earned == 4.0 and earned + tables.final[state] == 0.0
    assert np.all(tables.bonus[:, 0] == 0) and np.all(tables.next_state[:, 0] == np.arange(4))


def test_no_phrase_is_one_state_without_bonus():
    tables = no_boost(7)
    assert tables.bonus.shape == (1, 7) and not tables.bonus.any() and not tables.final.any()


# --- the phrase list ------------------------------------------------------------------


def test_a_phrase_list_reads_phrases_and_weights(tmp_path):
    path = tmp_path / "boost.txt"
    path.write_text("# names\nNew  York\n\nKubernetes\t3.5\n  \n")
    assert read_phrases(path, 2.0) == [Phrase("New York", 2.0), Phrase("Kubernetes", 3.5)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb\tmuch\n", "boost.txt:2: weight 'much' is not a number >= 0"),
        ("a\tnan\n", "boost.txt:1: weight 'nan'"),
        ("a\t-1\n", "boost.txt:1: weight '-1'"),
        ("\t2\n", "boost.txt:1: a weight without a phrase"),
    ],
)
def test_a_bad_phrase_list_is_named_with_its_line(tmp_path, text, message):
    path = tmp_path / "boost.txt"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        read_phrases(path)


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_a_list_without_phrases_is_no_boosting(tmp_path, tiny_tokenizer, text):
    path = tmp_path / "boost.txt"
    path.write_text(text)
    assert read_phrases(path) == []
    with pytest.warns(UserWarning, match="boost.txt: no phrase in it; decoding without"):
        tables = load_boost(path, tiny_tokenizer, 7)
    want = no_boost(7)
    for got, ref in zip(tables, want, strict=True):
        np.testing.assert_array_equal(got, ref)


def test_weights_in_the_hallucinating_range_are_named_with_their_bonus(tiny_tokenizer):
    pieces = len(tiny_tokenizer.encode("cab"))
    with pytest.warns(UserWarning, match=f"1 phrase.*'cab' 2.5 x {pieces} pieces = "):
        phrase_sequences([Phrase("cab", 2.5), Phrase("ab", 1.0)], tiny_tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        phrase_sequences([Phrase("cab", 1.9), Phrase("ab", 1.0)], tiny_tokenizer)


def test_phrases_become_the_tokenizers_segmentations(tiny_tokenizer):
    sequences = phrase_sequences([Phrase("a cab", 1.5), Phrase("ab", 0.5)], tiny_tokenizer)
    assert tuple(tiny_tokenizer.encode("a cab")) in sequences
    assert all(tiny_tokenizer.decode(s) == "A CAB" for s, w in sequences.items() if w == 1.5)
    with pytest.warns(UserWarning, match="1 phrase\\(s\\) hold characters"):
        phrase_sequences([Phrase("zebra\u00e9", 1.0)], tiny_tokenizer)


# --- the searches with boosting -------------------------------------------------------

LENGTHS = [60, 37, 21, 9]


def _eager_boosted_greedy(model, features, length, tables, max_symbols):
    """Frame by frame, eager: at each frame symbols until blank (at most `max_symbols`),
    each the argmax of log-prob + the bonus of the row's automaton state."""
    encoded, lengths = model.encode(features[None, :length], tf.constant([length]))
    out, state = model.predictor.step(tf.constant([BLANK_ID]), model.predictor.initial_state(1))
    where, tokens, frames = 0, [], []
    for t in range(int(lengths[0])):
        for _ in range(max_symbols):
            log_probs = tf.nn.log_softmax(model.join(encoded[:, t], out))[0].numpy()
            symbol = int(np.argmax(log_probs + tables.bonus[where]))
            if symbol == BLANK_ID:
                break
            tokens.append(symbol)
            frames.append(t)
            where = int(tables.next_state[where, symbol])
            out, state = model.predictor.step(tf.constant([symbol]), state)
    return tokens, frames


def _phrases_near(model, feats, count=3):
    """Token sequences greedy search almost emits: pieces of its own output, shifted."""
    plain = greedy_decode(model, feats, LENGTHS)
    sequences = {}
    for hypothesis in plain:
        for i in range(0, max(len(hypothesis.tokens) - 2, 0), 4)[:count]:
            piece = tuple((t % (model.vocab_size - 1)) + 1 for t in hypothesis.tokens[i : i + 2])
            sequences[piece] = 1.5
    return sequences


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_boosted_greedy_search_takes_the_eager_searchs_decisions(model, max_symbols):
    feats = random_features(LENGTHS, seed=5)
    tables = boost_tables(_phrases_near(model, feats), model.vocab_size)
    options = DecodeOptions("greedy", max_symbols_per_step=max_symbols)
    found = decode_batch(model, feats, LENGTHS, options=options, boost=combine(tables))
    plain = decode_batch(model, feats, LENGTHS, options=options)
    assert any(f.tokens != p.tokens for f, p in zip(found, plain, strict=True))  # it acts
    for b, n in enumerate(LENGTHS):
        tokens, frames = _eager_boosted_greedy(model, feats[b], n, tables, max_symbols)
        assert found[b].tokens == tokens and found[b].frames == frames


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_weight_zero_is_no_boosting_bit_for_bit(model, method):
    feats = random_features(LENGTHS, seed=6)
    zero = boost_tables(dict.fromkeys(_phrases_near(model, feats), 0.0), model.vocab_size)
    options = DecodeOptions(method, beam=4)
    plain = decode_nbest(model, feats, LENGTHS, options=options)
    for tables in (zero, no_boost(model.vocab_size)):
        assert decode_nbest(model, feats, LENGTHS, options=options, boost=combine(tables)) == plain


@pytest.mark.parametrize("max_symbols", [1, 2])
def test_wide_boosted_beam_finds_the_best_sequence_with_its_bonus_exactly(max_symbols):
    """Every path enumerated (`brute_force`), each sequence's total log-probability plus
    what brute force says its phrases earn: a beam that prunes nothing finds the best of
    those, with that score. The phrase is chosen so that boosting changes the winner."""
    model = tiny_transducer(vocab_size=3, seed=8, blank_bias=0.0)
    feature_frames = 19 if max_symbols == 1 else 15
    feats = random_features([feature_frames], seed=3)[0]
    exact = brute_force(model, feats, max_symbols)
    plain_best = max(exact, key=exact.get)
    runner_up = max((s for s in exact if s != plain_best and len(s) >= 2), key=exact.get)
    sequences = {runner_up[:2]: 3.0}
    boosted = {s: p + brute_total(s, sequences) for s, p in exact.items()}
    best = max(boosted, key=boosted.get)
    assert best != plain_best
    found = decode_batch(model, feats[None], [feature_frames],
                         options=DecodeOptions("beam", 256, max_symbols),
                         boost=combine(boost_tables(sequences, model.vocab_size)))[0]  # fmt: skip
    assert tuple(found.tokens) == best
    assert found.score == pytest.approx(boosted[best], abs=1e-4)


# --- TDT ------------------------------------------------------------------------------


def test_a_wide_boosted_tdt_beam_scores_every_sequence_with_its_bonus():
    """TDT beam search that prunes nothing: every sequence's log-probability over all its
    paths (enumerated) plus its phrases' bonus (brute force), and the boosted best first."""
    from asrkit.decoding.search.tdt_beam import tdt_beam_search
    from tests.decoding.search.test_tdt_beam import every_sequence, tdt_transducer

    model = tdt_transducer(vocab_size=3, durations=(0, 1, 2), seed=5)
    encoded = tf.constant(np.random.default_rng(3).standard_normal((1, 3, 16)), tf.float32)
    want = every_sequence(model, encoded[0], 3, max_symbols=2)
    plain_best = max(want, key=want.get)
    runner_up = max((s for s in want if s != plain_best and len(s) >= 2), key=want.get)
    sequences = {runner_up[:2]: 2.0}
    tables = boost_tables(sequences, model.vocab_size)
    found = tdt_beam_search(model, encoded, tf.constant([3]), 640, 2,
                            boost=as_tensors(combine(tables)))  # fmt: skip
    alive = live_slots(found.scores).numpy()[0]
    beam = {tuple(found.tokens[0, k, : found.counts[0, k]].numpy().tolist()):
            float(found.scores[0, k]) for k in np.flatnonzero(alive)}  # fmt: skip
    assert sorted(beam) == sorted(want)
    for tokens, log_p in want.items():
        assert beam[tokens] == pytest.approx(log_p + brute_total(tokens, sequences), abs=2e-4)
    best = max(beam, key=beam.get)
    assert best != plain_best and tuple(found.tokens[0, 0, : found.counts[0, 0]]) == best


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_boosted_tdt_beam_of_one_is_boosted_tdt_greedy_search(max_symbols):
    from asrkit.decoding.search.tdt_beam import tdt_beam_search
    from asrkit.decoding.search.tdt_greedy import tdt_greedy_search
    from tests.decoding.search.test_tdt_beam import tdt_transducer

    model = tdt_transducer(vocab_size=7, durations=(0, 1, 2, 3, 4), seed=2)
    lengths = tf.constant([9, 14, 1, 0, 12])
    encoded = tf.constant(np.random.default_rng(1).standard_normal((5, 14, 16)), tf.float32)
    plain = tdt_greedy_search(model, encoded, lengths, max_symbols)
    sequences = {}
    for row in range(5):
        tokens = plain.tokens[row, : plain.counts[row]].numpy().tolist()
        if len(tokens) >= 2:
            sequences[tuple(t % 6 + 1 for t in tokens[:2])] = 2.0
    tables = as_tensors(combine(boost_tables(sequences, 7)))
    greedy = tdt_greedy_search(model, encoded, lengths, max_symbols, boost=tables)
    beam = tdt_beam_search(model, encoded, lengths, 1, max_symbols, boost=tables)
    assert not np.array_equal(greedy.tokens.numpy(), plain.tokens.numpy())  # it acts
    np.testing.assert_array_equal(beam.counts[:, 0], greedy.counts)
    for row in range(5):
        n = int(greedy.counts[row])
        np.testing.assert_array_equal(beam.tokens[row, 0, :n], greedy.tokens[row, :n])
        np.testing.assert_array_equal(beam.frames[row, 0, :n], greedy.frames[row, :n])
    zero = as_tensors(combine(boost_tables(dict.fromkeys(sequences, 0.0), 7)))
    again = tdt_greedy_search(model, encoded, lengths, max_symbols, boost=zero)
    for got, want in zip(again, plain, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())

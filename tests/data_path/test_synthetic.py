"""The synthetic corpus: LibriSpeech layout, held-out voices, determinism, and it prepares clean."""

import random
import re

import numpy as np
import pytest
import soundfile

from asrkit.cli.main import main as cli
from asrkit.data.librispeech import prepare_librispeech
from asrkit.data.manifest import read_manifest
from asrkit.data.synthetic import (
    PARTS,
    PRESETS,
    grammar_text,
    make_synthetic_corpus,
    plan_corpus,
    sentence,
    split_identities,
    with_entity,
)
from asrkit.data.tts import Voice, available_voices, espeak_word_starts, synthesize


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    assert cli(["corpus", "synth", "--out", str(root), "--preset", "tiny", "--seed", "3"]) == 0
    return root


def test_layout_matches_librispeech(tiny):
    flacs = sorted(tiny.glob("*/*/*/*.flac"))
    assert len(flacs) == 12
    for flac in flacs:
        part, speaker, chapter = flac.parts[-4:-1]
        assert part in PARTS
        assert re.fullmatch(rf"{speaker}-{chapter}-\d{{4}}\.flac", flac.name)
        info = soundfile.info(flac)
        assert (info.samplerate, info.channels, info.format) == (16000, 1, "FLAC")
        assert 0.5 < info.duration < 10
        trans = flac.parent / f"{speaker}-{chapter}.trans.txt"
        lines = dict(line.split(" ", 1) for line in trans.read_text().splitlines())
        assert lines[flac.stem] == lines[flac.stem].upper() and lines[flac.stem].strip()
    speakers = (tiny / "SPEAKERS.TXT").read_text().splitlines()
    assert speakers[0].startswith(";ID") and len(speakers) == 1 + 6


def test_prepares_without_a_single_problem(tiny, tmp_path):
    reports = prepare_librispeech(tiny, list(PARTS), tmp_path, show_progress=False)
    assert [r.kept for r in reports] == [8, 2, 2]
    assert not any(r.problems for r in reports)
    train = read_manifest(tmp_path / "train-clean-100.jsonl")
    test = read_manifest(tmp_path / "test-clean.jsonl")
    assert {u.speaker for u in train}.isdisjoint({u.speaker for u in test})


def test_test_voices_are_never_heard_in_training():
    voices = available_voices()
    parts = split_identities(voices, random.Random(0))
    identities = {p: {v.identity for v in vs} for p, vs in parts.items()}
    assert identities[PARTS[0]].isdisjoint(identities[PARTS[2]])
    assert identities[PARTS[1]].isdisjoint(identities[PARTS[2]])
    assert identities[PARTS[0]].isdisjoint(identities[PARTS[1]])
    assert all(identities.values())


def test_same_seed_same_corpus_up_to_espeak_jitter(tiny, tmp_path):
    assert cli(["corpus", "synth", "--out", str(tmp_path), "--preset", "tiny", "--seed", "3"]) == 0
    first = sorted(p.relative_to(tiny) for p in tiny.rglob("*") if p.is_file())
    second = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert first == second
    for rel in first:
        if rel.suffix.lower() == ".txt":
            assert (tiny / rel).read_text() == (tmp_path / rel).read_text()
        else:
            a, b = soundfile.info(tiny / rel).duration, soundfile.info(tmp_path / rel).duration
            assert a == pytest.approx(b, rel=0.02)


def test_grammar_is_deterministic_and_small():
    a = [sentence(random.Random(1)) for _ in range(3)]
    assert a == [sentence(random.Random(1)) for _ in range(3)]
    rng = random.Random(0)
    vocabulary = {w for _ in range(3000) for w in sentence(rng).split()}
    assert 80 < len(vocabulary) < 200


def test_espeak_speaks_audibly():
    voice = next(v for v in available_voices() if v.engine == "espeak")
    samples = synthesize(voice, "hello world", 175, 50)
    assert samples.dtype == np.float32 and 0.4 < len(samples) / 16000 < 3
    assert np.abs(samples).max() > 0.1


NATURAL = [v for v in available_voices() if v.engine != "espeak"]


@pytest.mark.skipif(not NATURAL, reason="no Debian TTS engine (flite/festival) installed")
def test_natural_voices_share_identity_across_engines_and_pitch_shifts():
    by_identity = {}
    for voice in NATURAL:
        by_identity.setdefault(voice.identity, set()).add((voice.engine, voice.pitch_cents))
        samples = synthesize(voice, "the old man sold three red boxes", 175, 50)
        assert samples.dtype == np.float32 and 1.0 < len(samples) / 16000 < 6
        assert np.abs(samples).max() > 0.05
    if any(v.engine == "festival" and v.name == "kal_diphone" for v in NATURAL):
        assert {"flite", "festival"} <= {engine for engine, _ in by_identity["person:kal"]}
    parts = split_identities(NATURAL, random.Random(0))
    seen = [{v.identity for v in vs} for vs in parts.values()]
    assert all(a.isdisjoint(b) for i, a in enumerate(seen) for b in seen[i + 1 :])


def test_espeak_word_events_mark_where_each_word_begins():
    """eSpeak's word events (the word-timing reference): one per word, in order, inside the
    audio; and a word's event falls where its sound is: the event of the word after a long
    silence (eSpeak's pause for a comma) lies at the end of that silence."""
    voice = next(v for v in available_voices() if v.name == "en-us+m3")
    text = "the farmer opened the box, and the old man painted seven red letters"
    samples, words = espeak_word_starts(voice, text, rate=160, pitch=50, seed=1)
    assert [w for _, w in words] == text.replace(",", "").split()
    starts = [t for t, _ in words]
    assert starts == sorted(starts) and starts[-1] < len(samples) / 16_000
    # The silence of the comma: the quietest 100 ms stretch; "and" starts at its end.
    power = np.convolve(samples.astype(np.float64) ** 2, np.ones(1600) / 1600, mode="valid")
    middle = np.argmin(power[4000:-4000]) + 4000 + 800  # centre of the quietest stretch
    quiet = np.flatnonzero(power[middle - 800 :] > 10 * power[middle - 800])[0] + middle
    assert abs(starts[5] - quiet / 16_000) < 0.12, (starts[5], quiet / 16_000)


def test_a_natural_share_of_training_speakers_and_the_default_unchanged(tmp_path):
    """~160 eSpeak voices against a dozen natural ones: drawn uniformly, training is ~5 %
    natural speech; `natural_share` draws that share of the training speakers from the
    natural voices the training part has, and still never a held-out identity."""
    espeak = [Voice("espeak", f"en+v{i}", f"espeak:v{i % 27}", "M") for i in range(162)]
    natural = [Voice("flite", f"p{i}", f"person:p{i}", "F", cents)
               for i in range(5) for cents in (-300, 0, 300)]  # fmt: skip
    for seed in range(6):
        plan = plan_corpus(tmp_path, PRESETS["mini"], seed, espeak + natural, 30.0, 0.4)
        speakers = plan[0]
        by_part = {p: [s for s in speakers if s.part == p] for p in PARTS}
        train = by_part[PARTS[0]]
        heard = {s.voice.identity for s in train}
        if any(v.identity in heard for v in natural):
            share = np.mean([s.voice.engine == "flite" for s in train])
            assert share == pytest.approx(0.4, abs=0.01), seed
        uniform = plan_corpus(tmp_path, PRESETS["mini"], seed, espeak + natural, 30.0)[0]
        assert np.mean([s.voice.engine == "flite" for s in uniform if s.part == PARTS[0]]) < 0.2
        for part in PARTS[1:]:
            assert heard.isdisjoint(s.voice.identity for s in by_part[part])


def test_a_german_corpus_speaks_german_text_with_umlauts(tmp_path):
    """`--language de`: German sentences (umlauts, ß) from eSpeak NG's German voices; kept
    as written by `prepare librispeech --any-text`, refused by LibriSpeech's alphabet."""
    from asrkit.data.librispeech import ANY_TEXT

    report = make_synthetic_corpus(tmp_path / "de", "tiny", seed=2, show_progress=False,
                                   language="de")  # fmt: skip
    assert all(v.startswith("espeak:") for part in report.voices.values() for v in part)
    prepare_librispeech(tmp_path / "de", ["train-clean-100"], tmp_path / "any",
                        show_progress=False, alphabet=ANY_TEXT)  # fmt: skip
    texts = [u.text for u in read_manifest(tmp_path / "any" / "train-clean-100.jsonl")]
    assert len(texts) == 8 and any(set(t) & set("ÄÖÜß") for t in texts)
    (strict,) = prepare_librispeech(tmp_path / "de", ["train-clean-100"], tmp_path / "az",
                                    show_progress=False)  # fmt: skip
    assert {p.kind for p in strict.problems} == {"bad_characters"}


def test_entities_are_said_in_dev_and_test_only_and_the_rest_is_unchanged(tmp_path):
    """An entity list: about `entity_share` of the dev and test sentences say one of them
    in the subject's place, no training sentence does; every other sentence, voice and
    file is what the seed makes without entities."""
    voices = [Voice("espeak", f"en+v{i}", f"espeak:v{i}", "M") for i in range(40)]
    entities = ("ZANZIBAR", "KUBERNETES CLUSTER", "O'HARA")
    plain = plan_corpus(tmp_path, PRESETS["mini"], 3, voices, 30.0)
    named = plan_corpus(tmp_path, PRESETS["mini"], 3, voices, 30.0, entities=entities,
                        entity_share=0.4)  # fmt: skip
    assert plain[0] == named[0]
    said = {part: [] for part in PARTS}
    for before, after in zip(plain[1], named[1], strict=True):
        part = before.path.split("/")[-4]
        assert (before.path, before.voice, before.rate) == (after.path, after.voice, after.rate)
        found = [e for e in entities if f" {e} " in f" {after.text} "]
        said[part].append(bool(found))
        if not found:
            assert after.text == before.text
        else:  # the subject replaced, the rest of the sentence kept
            assert after.text.split(found[0])[-1] in before.text
    assert not any(said[PARTS[0]])
    for part in PARTS[1:]:
        assert np.mean(said[part]) == pytest.approx(0.4, abs=0.1), part


def test_with_entity_takes_the_subjects_place():
    assert with_entity("YESTERDAY THE OLD MAN SAW A RED BOX", "ZANZIBAR") == (
        "YESTERDAY ZANZIBAR SAW A RED BOX"
    )
    assert with_entity("DER ARZT SAH ZWEI ROTE KISTEN AM MEER", "PRAG", "de") == (
        "PRAG SAH ZWEI ROTE KISTEN AM MEER"
    )


def test_corpus_text_writes_grammar_sentences_with_entities_in_their_share(tmp_path):
    entities = tmp_path / "entities.txt"
    entities.write_text("new york\nKubernetes\n")
    out = tmp_path / "lm" / "text.txt"
    argv = ["corpus", "text", "--out", str(out), "--count", "400", "--seed", "3",
            "--entities", str(entities), "--entity-share", "0.25"]  # fmt: skip
    assert cli(argv) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 400
    said = [line for line in lines if "NEW YORK" in line or "KUBERNETES" in line]
    assert 0.15 < len(said) / 400 < 0.35
    rng = random.Random(1)
    vocabulary = {w for _ in range(5000) for w in sentence(rng).split()}
    for line in lines:  # every other word is the grammar's
        assert set(line.replace("NEW YORK", "").replace("KUBERNETES", "").split()) <= vocabulary
    assert grammar_text(400, 3, entities=("NEW YORK", "KUBERNETES"), entity_share=0.25) == lines
    assert grammar_text(50, 4) != grammar_text(50, 3)
    assert cli(["corpus", "text", "--out", str(out), "--count", "0"]) == 2
    assert len(out.read_text().splitlines()) == 400  # nothing written over

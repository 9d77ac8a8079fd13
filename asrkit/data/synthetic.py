"""A synthetic speech corpus in exactly the LibriSpeech layout, made with offline TTS.

    <out>/<part>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac   16 kHz mono FLAC
    <out>/<part>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt   upper-case transcripts
    <out>/SPEAKERS.TXT

Voices are split by *identity* (the underlying person or eSpeak voice), so the test part
holds only voices never heard in training. eSpeak gives ~160 voices (accent x variant) and
the natural engines a dozen, so speakers drawn uniformly from the training voices are ~95 %
eSpeak; `natural_share` > 0 draws that share of the training speakers from the natural
voices instead (when the training part has any), so the model hears more recorded people.
Texts come from a small built-in grammar: a vocabulary a model can learn in minutes on a CPU.
With an entity list (names, terms), a share of the dev and test sentences say one of them in
the subject's place; the training sentences never do, so a model trained on the corpus has
never heard them (what word boosting is measured on).

Determinism: the seed fixes every text, voice, rate, pitch, speaker and file name, and the
added noise. eSpeak NG's own voicing jitter is not seedable (even re-initialised, the
library drifts by a few milliseconds), so its audio is equal only to that tolerance.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from asrkit.audio import SAMPLE_RATE
from asrkit.data.tts import Voice, available_voices, synthesize
from asrkit.progress import progress

PARTS = ("train-clean-100", "dev-clean", "test-clean")


@dataclass(frozen=True)
class Preset:
    utterances: tuple[int, int, int]  # per part, in PARTS order
    speakers: tuple[int, int, int]
    # "grammar": the built-in grammar's sentences; "wordnet": open-vocabulary English
    # (`asrkit.data.open_text`: held-out names and words in dev and test)
    text: str = "grammar"
    # An adaptation corpus for a model trained on preset `adapts` (same seed): every part
    # spoken by that preset's held-out test voices; training and dev sentences from its
    # unspoken text pool (lm.txt), its test sentences as they were. What fine-tuning to
    # unheard voices is measured on; `voices` another part's (open-seen: what it forgets).
    adapts: str | None = None
    voices: str = "test-clean"


PRESETS = {
    "tiny": Preset(utterances=(8, 2, 2), speakers=(4, 1, 1)),  # a test fixture
    "mini": Preset(utterances=(1600, 120, 120), speakers=(80, 8, 8)),  # about 1.5 hours
    "open-tiny": Preset(utterances=(12, 4, 4), speakers=(4, 2, 2), text="wordnet"),
    # about 5.5 hours of training audio over ~12 thousand words (built in ~2 minutes)
    "open": Preset(utterances=(9000, 300, 400), speakers=(270, 15, 15), text="wordnet"),
    # about 0.9 hours of the open preset's test voices saying other sentences
    "open-voices": Preset(
        utterances=(1500, 150, 400), speakers=(30, 10, 15), text="wordnet", adapts="open"
    ),
    # the open preset's test sentences said by its training voices only (a test part alone)
    "open-seen": Preset(
        utterances=(0, 0, 400),
        speakers=(0, 0, 30),
        text="wordnet",
        adapts="open",
        voices="train-clean-100",
    ),
}

_SUBJECTS = "THE CAT|A DOG|MY FRIEND|HER BROTHER|THE OLD MAN|A YOUNG GIRL|THE TEACHER|OUR NEIGHBOUR|THE DOCTOR|HIS SISTER|THE FARMER|A CHILD"  # noqa: E501
_VERBS = "SAW|FOUND|WANTED|BOUGHT|PAINTED|CARRIED|DROPPED|OPENED|CLEANED|SOLD|MOVED|LOST"
_ADJECTIVES = "RED|GREEN|BLUE|BIG|SMALL|HEAVY|BROKEN|SHINY|WOODEN|YELLOW|WHITE|BLACK"
_NOUNS = "BOX:BOXES|CHAIR:CHAIRS|BOOK:BOOKS|BALL:BALLS|HOUSE:HOUSES|WINDOW:WINDOWS|TABLE:TABLES|LETTER:LETTERS|BICYCLE:BICYCLES|BASKET:BASKETS|CUP:CUPS|DOOR:DOORS"  # noqa: E501
_PLACES = "IN THE KITCHEN|NEAR THE RIVER|AT THE MARKET|BEHIND THE SCHOOL|ON THE HILL|UNDER THE BRIDGE|IN THE GARDEN|BY THE SEA"  # noqa: E501
_TIMES = "YESTERDAY|THIS MORNING|LAST WEEK|ON MONDAY|AT NIGHT|TODAY|ON SUNDAY|IN THE EVENING"
_NUMBERS = "TWO|THREE|FOUR|FIVE|SIX|SEVEN|EIGHT|NINE|TEN|ELEVEN|TWELVE"


# German (`language="de"`): plural objects (no article to agree with), verb-second order.
_DE_SUBJECTS = "DIE KATZE|EIN HUND|MEIN FREUND|IHR BRUDER|DER ALTE MANN|EIN JUNGES MÄDCHEN|DIE LEHRERIN|UNSER NACHBAR|DER ARZT|SEINE SCHWESTER|DER BAUER|EIN KIND"  # noqa: E501
_DE_VERBS = "SAH|FAND|WOLLTE|KAUFTE|MALTE|TRUG|VERLOR|ÖFFNETE|PUTZTE|VERKAUFTE|ZÄHLTE|SUCHTE"
_DE_ADJECTIVES = (
    "ROTE|GRÜNE|BLAUE|GROßE|KLEINE|SCHWERE|KAPUTTE|GLÄNZENDE|HÖLZERNE|GELBE|WEIßE|SCHWARZE"
)
_DE_NOUNS = "KISTEN|STÜHLE|BÜCHER|BÄLLE|HÄUSER|FENSTER|TISCHE|BRIEFE|FAHRRÄDER|KÖRBE|TASSEN|TÜREN"
_DE_PLACES = "IN DER KÜCHE|AM FLUSS|AUF DEM MARKT|HINTER DER SCHULE|AUF DEM HÜGEL|UNTER DER BRÜCKE|IM GARTEN|AM MEER"  # noqa: E501
_DE_TIMES = "GESTERN|HEUTE MORGEN|LETZTE WOCHE|AM MONTAG|IN DER NACHT|HEUTE|AM SONNTAG|AM ABEND"
_DE_NUMBERS = "ZWEI|DREI|VIER|FÜNF|SECHS|SIEBEN|ACHT|NEUN|ZEHN|ELF|ZWÖLF"
LANGUAGES = ("en", "de")


def sentence(rng: random.Random, language: str = "en") -> str:
    """One sentence of the built-in grammar of `language` (about 120 distinct words)."""

    def pick(options: str) -> str:
        return rng.choice(options.split("|"))

    if language == "de":
        return _german(rng, pick)
    singular, plural = pick(_NOUNS).split(":")
    template = rng.randrange(4)
    if template == 0:
        words = [pick(_SUBJECTS), pick(_VERBS), "THE", pick(_ADJECTIVES), singular, pick(_PLACES)]
    elif template == 1:
        words = [pick(_SUBJECTS), pick(_VERBS), pick(_NUMBERS), pick(_ADJECTIVES), plural]
    elif template == 2:
        words = [pick(_TIMES), pick(_SUBJECTS), pick(_VERBS), "A", pick(_ADJECTIVES), singular]
    else:
        other = pick(_NOUNS).split(":")[0]
        words = [pick(_SUBJECTS), pick(_VERBS), "THE", singular, "AND THE", other, pick(_PLACES)]
    return " ".join(words)


def with_entity(text: str, entity: str, language: str = "en") -> str:
    """`text` (a `sentence`) with `entity` in its subject's place."""
    subjects = (_DE_SUBJECTS if language == "de" else _SUBJECTS).split("|")
    padded = f" {text} "
    for subject in sorted(subjects, key=len, reverse=True):
        at = padded.find(f" {subject} ")
        if at >= 0:
            return (padded[: at + 1] + entity + padded[at + 1 + len(subject) :]).strip()
    return f"{entity} {text}"


def grammar_text(count: int, seed: int, language: str = "en", entities: tuple[str, ...] = (),
                 entity_share: float = 0.5) -> list[str]:  # fmt: skip
    """`count` sentences of the built-in grammar, text only (e.g. to train an LM); with
    `entities`, each sentence says one of them in its subject's place with probability
    `entity_share`. The same seed gives the same text."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text = sentence(rng, language)
        if entities and rng.random() < entity_share:
            text = with_entity(text, rng.choice(entities), language)
        out.append(text)
    return out


def _german(rng: random.Random, pick) -> str:
    objects = [pick(_DE_NUMBERS), pick(_DE_ADJECTIVES), pick(_DE_NOUNS)]
    template = rng.randrange(3)
    if template == 0:
        words = [pick(_DE_SUBJECTS), pick(_DE_VERBS), *objects, pick(_DE_PLACES)]
    elif template == 1:
        words = [pick(_DE_TIMES), pick(_DE_VERBS), pick(_DE_SUBJECTS), *objects]
    else:
        words = [pick(_DE_SUBJECTS), pick(_DE_VERBS), objects[0], objects[2], pick(_DE_PLACES)]
    return " ".join(words)


@dataclass(frozen=True)
class Speaker:
    id: int
    part: str
    voice: Voice
    rate: int  # words per minute (eSpeak)
    pitch: int  # 0-100 (eSpeak)


@dataclass(frozen=True)
class _Job:
    path: str
    text: str
    voice: Voice
    rate: int
    pitch: int
    seed: int
    noise_db: float


@dataclass(frozen=True)
class CorpusReport:
    root: Path
    utterances: dict[str, int]  # per part
    hours: dict[str, float]
    voices: dict[str, list[str]]  # identities per part


def split_identities(voices: list[Voice], rng: random.Random) -> dict[str, list[Voice]]:
    """Disjoint voice identities per part: about 70 % train, 15 % dev, 15 % test."""
    identities = sorted({v.identity for v in voices})
    rng.shuffle(identities)
    n = len(identities)
    held = max(1, round(0.15 * n))
    groups = {
        PARTS[2]: set(identities[:held]),
        PARTS[1]: set(identities[held : 2 * held]),
        PARTS[0]: set(identities[2 * held :]),
    }
    return {part: [v for v in voices if v.identity in ids] for part, ids in groups.items()}


def _speaker_voices(pool: list[Voice], n: int, rng: random.Random, natural_share) -> list:
    """The voices of a part's `n` speakers: every voice of the pool once while there are
    more speakers than voices, then random ones. With `natural_share`, that share of the
    speakers comes from the pool's natural voices (if any) and the rest from eSpeak's."""
    natural = [v for v in pool if v.engine != "espeak"]
    espeak = [v for v in pool if v.engine == "espeak"]
    if natural_share is None or not natural or not espeak:
        groups = [(pool, n)]
    else:
        n_natural = round(natural_share * n)
        groups = [(natural, n_natural), (espeak, n - n_natural)]
    chosen = []
    for voices, count in groups:
        voices = list(voices)
        rng.shuffle(voices)
        chosen += [voices[k] if k < len(voices) else rng.choice(voices) for k in range(count)]
    if len(groups) > 1:
        rng.shuffle(chosen)
    return chosen


def plan_corpus(
    out_dir: Path,
    preset: Preset,
    seed: int,
    voices: list[Voice],
    noise_db: float,
    natural_share: float = 0.0,
    language: str = "en",
    entities: tuple[str, ...] = (),
    entity_share: float = 0.5,
    texts: dict[str, list[str]] | None = None,
) -> tuple[list[Speaker], list[_Job], dict[Path, list[str]]]:
    """Every utterance's speaker, text and file. `texts`: each part's sentences in the
    order spoken (an open-text preset's split) instead of the grammar's."""
    rng = random.Random(seed)
    # its own generator: a corpus without entities is the one this seed always made
    entity_rng = random.Random(seed + 7919)
    by_part = split_identities(voices, rng)
    if preset.adapts:  # the adapted preset's voices of one part, in every part
        by_part = {part: by_part[preset.voices] for part in PARTS}
    speakers, jobs, transcripts = [], [], {}
    next_id = 100
    for part, n_utts, n_speakers in zip(PARTS, preset.utterances, preset.speakers, strict=True):
        share = natural_share if part == PARTS[0] and natural_share > 0 else None
        part_speakers = []
        for voice in _speaker_voices(list(by_part[part]), n_speakers, rng, share):
            speaker = Speaker(next_id, part, voice, rng.randint(140, 200), rng.randint(30, 70))
            next_id += 1
            part_speakers.append(speaker)
        speakers += part_speakers
        for i in range(n_utts):
            spk = part_speakers[i % n_speakers]
            chapter = spk.id * 10
            utt = i // n_speakers
            folder = out_dir / part / str(spk.id) / str(chapter)
            utt_id = f"{spk.id}-{chapter}-{utt:04d}"
            text = texts[part][i] if texts is not None else sentence(rng, language)
            if entities and part != PARTS[0] and entity_rng.random() < entity_share:
                text = with_entity(text, entity_rng.choice(entities), language)
            rate = spk.rate + rng.randint(-10, 10)
            jobs.append(
                _Job(str(folder / f"{utt_id}.flac"), text, spk.voice, rate, spk.pitch,
                     rng.randrange(2**31), noise_db)
            )  # fmt: skip
            transcripts.setdefault(folder / f"{spk.id}-{chapter}.trans.txt", []).append(
                f"{utt_id} {text}"
            )
    return speakers, jobs, transcripts


def _render(job: _Job) -> float:
    samples = synthesize(job.voice, job.text.lower(), job.rate, job.pitch, job.seed)
    if samples.size == 0:
        raise RuntimeError(f"{job.path}: the TTS engine produced no audio for {job.text!r}")
    # TTS output has digital silence; a faint noise floor makes it less unlike a recording.
    noise = np.random.default_rng(job.seed).standard_normal(samples.size)
    samples = samples + (10 ** (job.noise_db / 20)) * noise.astype(np.float32)
    samples = np.clip(samples, -1.0, 1.0)
    Path(job.path).parent.mkdir(parents=True, exist_ok=True)
    tmp = job.path + ".tmp"
    soundfile.write(tmp, samples, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    os.replace(tmp, job.path)
    return samples.size / SAMPLE_RATE


def make_synthetic_corpus(
    out_dir: str | os.PathLike,
    preset: str = "mini",
    seed: int = 0,
    workers: int = 2,
    noise_db: float = -60.0,
    show_progress: bool = True,
    natural_share: float = 0.0,
    language: str = "en",
    entities: tuple[str, ...] = (),
    entity_share: float = 0.5,
) -> CorpusReport:
    """Synthesises the corpus under `out_dir` and returns what was made. `language`: the
    grammar's and the voices' ("de": eSpeak NG's German voices, no natural ones).
    `entities`: names or terms said in `entity_share` of the dev and test sentences."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; choose from {LANGUAGES}")
    out_dir = Path(out_dir)
    voices = available_voices(language)
    if not 0 <= natural_share <= 1:
        raise ValueError(f"natural_share must be in [0, 1], got {natural_share}")
    if not 0 <= entity_share <= 1:
        raise ValueError(f"entity_share must be in [0, 1], got {entity_share}")
    texts = None
    if PRESETS[preset].text == "wordnet":
        if language != "en" or entities:
            raise ValueError(f"preset {preset!r} speaks English and holds out its own names: "
                             "no --language or --entities with it")  # fmt: skip
        texts = _open_texts(out_dir, PRESETS[preset], seed)
    speakers, jobs, transcripts = plan_corpus(
        out_dir, PRESETS[preset], seed, voices, noise_db, natural_share, language,
        tuple(" ".join(e.upper().split()) for e in entities), entity_share, texts,
    )  # fmt: skip
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        durations = list(
            progress(
                pool.map(_render, jobs, chunksize=8),
                total=len(jobs),
                label=f"synth {preset}",
                enabled=show_progress,
            )
        )
    for path, lines in transcripts.items():
        path.write_text("\n".join(lines) + "\n")
    _write_speakers(out_dir, speakers, jobs, durations)
    hours = {part: 0.0 for part in PARTS}
    counts = {part: 0 for part in PARTS}
    for job, duration in zip(jobs, durations, strict=True):
        part = Path(job.path).relative_to(out_dir).parts[0]
        hours[part] += duration / 3600
        counts[part] += 1
    identities = {p: sorted({s.voice.identity for s in speakers if s.part == p}) for p in PARTS}
    return CorpusReport(out_dir, counts, hours, identities)


def _open_texts(out_dir: Path, preset: Preset, seed: int) -> dict[str, list[str]]:
    """An open-text preset's sentences per part (`asrkit.data.open_text`), and beside the
    corpus what they hold: TEXT.json (source and licence, counts, the share of dev and test
    words the training transcripts never say), names.txt (the held-out names said in dev
    and test, a phrase list for word boosting) and lm.txt (the training pool's sentences
    that are not spoken: text for an LM disjoint from the transcripts and the test)."""
    import json

    from asrkit.data.open_text import (
        WORDNET_NOTICE,
        oov_share,
        proper_nouns,
        split_open_text,
        wordnet_sentences,
    )

    sentences = wordnet_sentences()
    n_train, n_dev, n_test = preset.utterances
    base = PRESETS[preset.adapts] if preset.adapts else preset
    split = split_open_text(sentences, proper_nouns(sentences), seed, *base.utterances[1:])
    # an adaptation corpus speaks what its base never did: sentences of the unspoken pool
    skip = base.utterances[0] if preset.adapts else 0
    dev = split.train[skip + n_train : skip + n_train + n_dev] if preset.adapts else split.dev
    if len(split.train) < skip + n_train + (n_dev if preset.adapts else 0):
        raise ValueError(f"the text holds {len(split.train)} training sentences, too few")
    spoken = list(split.train[skip : skip + n_train])
    texts = {PARTS[0]: spoken, PARTS[1]: list(dev), PARTS[2]: list(split.test[:n_test])}
    unspoken = split.train[skip + n_train + (n_dev if preset.adapts else 0) :]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "source": "WordNet 3.0 usage examples (Debian's wordnet-base)",
        "licence": f"Princeton WordNet licence: {WORDNET_NOTICE}",
        "sentences": {part: len(t) for part, t in texts.items()},
        "training_vocabulary": len({w for t in spoken for w in t.split()}),
        "oov_share": {part: round(oov_share(texts[part], spoken), 4) for part in PARTS[1:]},
        "oov_share_against_lm_text": {
            part: round(oov_share(texts[part], split.train), 4) for part in PARTS[1:]
        },
        "names": list(split.names),
        "held_out_words": len(split.held_out_words),
        "lm_sentences": len(unspoken),
    }
    if preset.adapts:
        report["adapts"] = f"preset {preset.adapts}, seed {seed}: its test voices and sentences"
    (out_dir / "TEXT.json").write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / "names.txt").write_text("".join(n + "\n" for n in split.names))
    (out_dir / "lm.txt").write_text("".join(t + "\n" for t in unspoken))
    return texts


def _write_speakers(out_dir: Path, speakers: list[Speaker], jobs, durations) -> None:
    minutes: dict[int, float] = {}
    for job, duration in zip(jobs, durations, strict=True):
        speaker_id = int(Path(job.path).name.split("-")[0])
        minutes[speaker_id] = minutes.get(speaker_id, 0.0) + duration / 60
    lines = [";ID  |SEX| SUBSET           |MINUTES| NAME"]
    for s in speakers:
        name = f"{s.voice.engine}:{s.voice.name} rate={s.rate} pitch={s.pitch}"
        lines.append(
            f"{s.id:<5}| {s.voice.sex} | {s.part:<16} | {minutes.get(s.id, 0):5.2f} | {name}"
        )
    (out_dir / "SPEAKERS.TXT").write_text("\n".join(lines) + "\n")

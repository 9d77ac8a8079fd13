"""LibriSpeech-layout preparation on real speech and on deliberately broken corpora."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.audio import AudioError, audio_info, read_audio
from asrkit.cli.main import main as cli
from asrkit.data.librispeech import prepare_librispeech
from asrkit.data.manifest import read_manifest

REAL = Path(__file__).parents[1] / "data" / "realspeech"


def test_real_recordings_prepare_with_their_true_durations(tmp_path):
    reports = prepare_librispeech(REAL, ["test-real"], tmp_path, show_progress=False)
    utts = read_manifest(tmp_path / "test-real.jsonl")
    assert len(utts) == 5 and not reports[0].problems
    assert [u.id for u in utts] == [f"9002-90021-000{i}" for i in range(5)]
    for u in utts:
        with soundfile.SoundFile(u.audio_path) as f:
            assert u.duration == pytest.approx(f.frames / f.samplerate)
        assert u.speaker == "9002" and u.text == u.text.upper()
    # The fixture's README: 24.7 s of speech in total.
    assert sum(u.duration for u in utts) == pytest.approx(24.7, abs=0.05)
    samples = read_audio(utts[0].audio_path)
    assert samples.dtype == np.float32 and len(samples) == round(utts[0].duration * 16000)
    assert 0.01 < np.abs(samples).max() <= 1.0


def _tone(path, seconds=0.5, rate=16000):
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)


@pytest.fixture
def broken_corpus(tmp_path):
    chapter = tmp_path / "corpus" / "dev" / "7" / "70"
    chapter.mkdir(parents=True)
    for i in range(7):
        _tone(chapter / f"7-70-000{i}.flac")
    _tone(chapter / "7-70-0005.flac", rate=8000)  # wrong sample rate
    (chapter / "7-70-0006.flac").write_bytes(b"this is not a flac file at all")  # corrupt
    _tone(chapter / "7-70-0009.flac")  # audio without a transcript line
    lines = [
        "7-70-0000 GOOD ONE",
        "7-70-0001 GOOD TWO'S",
        "7-70-0002 ",  # empty text
        "7-70-0003 BAD CHARACTERS 123!",
        "7-70-0004 ANOTHER GOOD",
        "7-70-0005 EIGHT KILOHERTZ",
        "7-70-0006 CORRUPT AUDIO",
        "7-70-0008 NO AUDIO FOR THIS LINE",
    ]
    (chapter / "7-70.trans.txt").write_text("\n".join(lines) + "\n")
    return tmp_path / "corpus"


def test_every_bad_input_is_reported_by_id_and_kept_out(broken_corpus, tmp_path):
    out = tmp_path / "manifests"
    (report,) = prepare_librispeech(
        broken_corpus, ["dev"], out, resample=False, show_progress=False
    )
    kinds = {p.utterance_id: p.kind for p in report.problems}
    assert kinds == {
        "7-70-0002": "empty_text",
        "7-70-0003": "bad_characters",
        "7-70-0005": "sample_rate",
        "7-70-0006": "unreadable_audio",
        "7-70-0008": "missing_audio",
        "7-70-0009": "missing_transcript",
    }
    kept = read_manifest(out / "dev.jsonl")
    assert [u.id for u in kept] == ["7-70-0000", "7-70-0001", "7-70-0004"]
    assert all(u.duration == pytest.approx(0.5) for u in kept)


def test_resampling_keeps_other_rates_and_reads_them_at_16k(broken_corpus, tmp_path):
    (report,) = prepare_librispeech(broken_corpus, ["dev"], tmp_path, show_progress=False)
    assert "7-70-0005" not in {p.utterance_id for p in report.problems}
    utt = next(u for u in read_manifest(tmp_path / "dev.jsonl") if u.id == "7-70-0005")
    assert audio_info(utt.audio_path).sample_rate == 8000
    samples = read_audio(utt.audio_path)
    assert len(samples) == 8000  # 0.5 s at 16 kHz
    # A 440 Hz tone stays a 440 Hz tone.
    spectrum = np.abs(np.fft.rfft(samples))
    assert np.argmax(spectrum) * 16000 / len(samples) == pytest.approx(440, abs=4)


def test_cli_strict_fails_and_lenient_succeeds(broken_corpus, tmp_path, capsys):
    args = ["prepare", "librispeech", "--root", str(broken_corpus), "--parts", "dev"]
    assert cli([*args, "--out", str(tmp_path / "a")]) == 0
    assert cli([*args, "--out", str(tmp_path / "b"), "--strict"]) == 1
    out = capsys.readouterr().out
    assert "7-70-0008: missing_audio" in out and "kept 4 utterances" in out


def test_missing_part_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-part"):
        prepare_librispeech(REAL, ["no-such-part"], tmp_path)


def test_unreadable_audio_raises_audio_error(tmp_path):
    bad = tmp_path / "x.flac"
    shutil.copy(__file__, bad)
    with pytest.raises(AudioError, match=r"x\.flac"):
        read_audio(bad)


def test_any_text_keeps_other_languages_case_and_punctuation(broken_corpus, tmp_path):
    """With ANY_TEXT (`prepare librispeech --any-text`) a transcript is kept as written
    (NFC), digits and punctuation included; only control characters are refused."""
    from asrkit.data.librispeech import ANY_TEXT

    chapter = broken_corpus / "dev" / "7" / "70"
    lines = [
        "7-70-0000 Grüße aus Köln, 123!",
        "7-70-0001 Cafe\u0301 crème",
        "7-70-0004 BAD\x07BELL",
    ]
    (chapter / "7-70.trans.txt").write_text("\n".join(lines) + "\n")
    (report,) = prepare_librispeech(broken_corpus, ["dev"], tmp_path / "m", resample=False,
                                    show_progress=False, alphabet=ANY_TEXT)  # fmt: skip
    kept = {u.id: u.text for u in read_manifest(tmp_path / "m" / "dev.jsonl")}
    assert kept == {"7-70-0000": "Grüße aus Köln, 123!", "7-70-0001": "Café crème"}
    assert {p.utterance_id: p.kind for p in report.problems}["7-70-0004"] == "bad_characters"

"""Audio that is not 16 kHz mono is converted, counted, and reported in one line."""

import numpy as np
import soundfile

from asrkit import audio


def test_conversions_are_counted_and_reported_once_with_a_warning_below_16k(tmp_path, monkeypatch):
    monkeypatch.setattr(audio, "CONVERTED", audio.Counter())
    tone = np.sin(np.arange(8000) / 5).astype(np.float32) * 0.1
    soundfile.write(tmp_path / "mono16.wav", np.tile(tone, 2), 16000)
    soundfile.write(tmp_path / "stereo44.wav", np.stack([tone, tone], 1), 44100)
    soundfile.write(tmp_path / "tel8.wav", tone, 8000)
    assert audio.read_audio(tmp_path / "mono16.wav").shape == (16000,)
    assert audio.conversion_notice() is None
    stereo = audio.read_audio(tmp_path / "stereo44.wav")
    assert abs(len(stereo) - round(8000 * 16000 / 44100)) <= 1
    audio.read_audio(tmp_path / "tel8.wav")
    audio.read_audio(tmp_path / "tel8.wav")
    notice = audio.conversion_notice()
    assert notice.startswith("3 audio file(s) converted to 16 kHz mono")
    assert "2 at 8000 Hz mono" in notice and "1 at 44100 Hz 2 channels" in notice
    assert "expect lower accuracy" in notice


def test_a_missing_file_says_so_in_plain_words(tmp_path):
    import pytest

    with pytest.raises(audio.AudioError, match="no such audio file"):
        audio.read_audio(tmp_path / "nope.flac")

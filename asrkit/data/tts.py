"""Offline text-to-speech engines for the synthetic corpus.

* eSpeak NG through the pip-only `espeakng-loader` wheel (bundled libespeak-ng and voice
  data), driven with ctypes: always available, fast, robotic.
* Debian's `flite` (voices kal16, slt, rms, awb) and `festival` (kal, ked, slt-HTS), when
  installed: far more natural. flite's kal16 and festival's kal are one person, as are slt
  and slt-HTS, so a voice's `identity` names the underlying person and the corpus splits
  by it. With `sox` installed, pitch-shifted copies of the natural voices (same tempo)
  make extra speakers; a shifted voice keeps its person's identity.

Every engine returns mono float32 samples at 16 kHz.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from asrkit.audio import SAMPLE_RATE, resample


@dataclass(frozen=True)
class Voice:
    engine: str  # "espeak" | "flite"
    name: str  # engine-specific voice name
    identity: str  # the underlying person/voice, for held-out splits
    sex: str  # "F" | "M"
    pitch_cents: int = 0  # sox pitch shift applied after synthesis (natural voices)


ESPEAK_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc")
ESPEAK_VARIANTS = {  # name: sex
    "f1": "F", "f2": "F", "f3": "F", "f4": "F", "f5": "F", "m1": "M", "m2": "M", "m3": "M",
    "m4": "M", "m5": "M", "m6": "M", "m7": "M", "klatt": "M", "klatt2": "M", "klatt3": "M",
    "klatt4": "F", "Annie": "F", "linda": "F", "belinda": "F", "aunty": "F", "grandma": "F",
    "david": "M", "edward": "M", "john": "M", "max": "M", "norbert": "M", "adam": "M",
}  # fmt: skip
FLITE_VOICES = {
    "kal16": ("kal", "M"),
    "slt": ("slt", "F"),
    "rms": ("rms", "M"),
    "awb": ("awb", "M"),
}
FESTIVAL_VOICES = {  # voice directory: (person, sex)
    "kal_diphone": ("kal", "M"),
    "ked_diphone": ("ked", "M"),
    "cmu_us_slt_arctic_hts": ("slt", "F"),
}
FESTIVAL_VOICE_DIR = Path("/usr/share/festival/voices")
PITCH_SHIFTS = (-300, 300)  # cents


def available_voices(language: str = "en") -> list[Voice]:
    """Every voice of every engine present on this machine that speaks `language` (eSpeak
    NG always; the natural engines speak English only)."""
    # An eSpeak variant is the voice (timbre); the accent only changes pronunciation, so
    # the identity is the variant: a held-out variant is unheard in every accent.
    accents = ESPEAK_ACCENTS if language == "en" else (language,)
    voices = [
        Voice("espeak", f"{accent}+{variant}", f"espeak:{variant}", sex)
        for accent in accents
        for variant, sex in ESPEAK_VARIANTS.items()
    ]
    if language != "en":
        return voices
    natural = []
    if shutil.which("flite"):
        natural += [
            Voice("flite", name, f"person:{person}", sex)
            for name, (person, sex) in FLITE_VOICES.items()
        ]
    if shutil.which("text2wave"):
        installed = {p.name for p in FESTIVAL_VOICE_DIR.glob("*/*") if p.is_dir()}
        natural += [
            Voice("festival", name, f"person:{person}", sex)
            for name, (person, sex) in FESTIVAL_VOICES.items()
            if name in installed
        ]
    if natural and shutil.which("sox"):
        natural += [
            Voice(v.engine, v.name, v.identity, v.sex, cents)
            for v in natural
            for cents in PITCH_SHIFTS
        ]
    return voices + natural


def synthesize(
    voice: Voice, text: str, rate: int = 175, pitch: int = 50, seed: int = 0
) -> np.ndarray:
    """Speaks `text`; `rate` (words per minute), `pitch` (0-100) and `seed` (the breath and
    jitter noise of some variants) apply to eSpeak. Same arguments, same samples."""
    if voice.engine == "espeak":
        return _Espeak.instance().speak(voice.name, text, rate, pitch, seed)
    stretch = 175 / max(rate, 1)
    if voice.engine == "flite":
        command = ["flite", "-voice", voice.name, "--setf", f"duration_stretch={stretch:.3f}"]
        samples = _run_to_wav([*command, "-t", text, "-o", "{out}"], None, voice.pitch_cents)
    elif voice.engine == "festival":
        setup = f"(voice_{voice.name}) (Parameter.set 'Duration_Stretch {stretch:.3f})"
        samples = _run_to_wav(["text2wave", "-eval", setup, "-o", "{out}"], text, voice.pitch_cents)
    else:
        raise ValueError(f"unknown TTS engine {voice.engine!r}")
    return samples


class _Event(ctypes.Structure):
    """libespeak-ng's espeak_EVENT (speak_lib.h)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # milliseconds from the start of the text
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),  # a union of int / char* / char[8]: the widest
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)
_EVENT_LIST_END, _EVENT_WORD = 0, 1
_SYNCHRONOUS, _POS_CHARACTER, _CHARS_UTF8 = 2, 1, 1
_RATE, _PITCH = 1, 3


class _Espeak:
    """libespeak-ng is process-global state: one initialised instance per process."""

    _lock = threading.Lock()
    _singleton: _Espeak | None = None

    def __init__(self):
        import espeakng_loader

        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        data = espeakng_loader.get_data_path()
        self.rate = self.lib.espeak_Initialize(_SYNCHRONOUS, 0, str(data).encode(), 0)
        if self.rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed with data at {data}")
        self.chunks: list[np.ndarray] = []
        self.word_events: list[tuple[int, int, int]] = []  # (ms, text position, length)

        def collect(wav, count, events):
            if count > 0:
                self.chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
            i = 0
            while events and events[i].type != _EVENT_LIST_END:
                event = events[i]
                if event.type == _EVENT_WORD:
                    self.word_events.append(
                        (event.audio_position, event.text_position, event.length)
                    )
                i += 1
            return 0

        self.callback = _CALLBACK(collect)  # keep a reference: C holds only a pointer
        self.lib.espeak_SetSynthCallback(self.callback)

    @classmethod
    def instance(cls) -> _Espeak:
        with cls._lock:
            if cls._singleton is None:
                cls._singleton = cls()
            return cls._singleton

    def speak(self, voice: str, text: str, rate: int, pitch: int, seed: int) -> np.ndarray:
        return self.speak_words(voice, text, rate, pitch, seed)[0]

    def speak_words(
        self, voice: str, text: str, rate: int, pitch: int, seed: int
    ) -> tuple[np.ndarray, list[tuple[float, str]]]:
        """Samples, and each word's start (seconds) with the word as written."""
        with self._lock:
            self.lib.espeak_ng_SetRandSeed(ctypes.c_long(seed))
            if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"eSpeak NG has no voice {voice!r}")
            self.lib.espeak_SetParameter(_RATE, int(rate), 0)
            self.lib.espeak_SetParameter(_PITCH, int(pitch), 0)
            self.chunks, self.word_events = [], []
            data = text.encode("utf-8") + b"\0"
            status = self.lib.espeak_Synth(
                data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            if status != 0:
                raise RuntimeError(f"espeak_Synth failed ({status}) for {text!r}")
            self.lib.espeak_Synchronize()
            pcm = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)
            raw = text.encode("utf-8")
            words = [  # text positions count characters from 1
                (ms / 1000, raw[position - 1 : position - 1 + length].decode("utf-8", "replace"))
                for ms, position, length in self.word_events
            ]
        return resample(pcm.astype(np.float32) / 32768.0, self.rate, SAMPLE_RATE), words


def espeak_word_starts(
    voice: Voice, text: str, rate: int = 175, pitch: int = 50, seed: int = 0
) -> tuple[np.ndarray, list[tuple[float, str]]]:
    """`synthesize` for an eSpeak voice, plus eSpeak's own word events: each word's start
    in seconds with the word as written (a reference for word timings)."""
    if voice.engine != "espeak":
        raise ValueError(f"word events come from eSpeak voices only, not {voice.engine!r}")
    return _Espeak.instance().speak_words(voice.name, text, rate, pitch, seed)


def _run_to_wav(command: list[str], stdin: str | None, pitch_cents: int) -> np.ndarray:
    """Runs a TTS program that writes a WAV file ({out} in `command`), then sox pitch."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.wav"
        command = [str(out) if part == "{out}" else part for part in command]
        subprocess.run(command, input=stdin, text=True, check=True, capture_output=True)
        if pitch_cents:
            shifted = Path(tmp) / "shifted.wav"
            subprocess.run(
                ["sox", str(out), str(shifted), "pitch", str(pitch_cents)],
                check=True,
                capture_output=True,
            )
            out = shifted
        samples, rate = soundfile.read(out, dtype="float32", always_2d=True)
    samples = samples.mean(axis=1)
    return samples if rate == SAMPLE_RATE else resample(samples, rate, SAMPLE_RATE)

"""Training utterances that run on past a sentence end: consecutive utterances of one
speaker joined into one, their audio back to back and their transcripts joined by a space.

A model trained only on single sentences has never heard one sentence follow another, and
in a long recording it drops what comes after the first sentence of a window. Joining
some of its training utterances (`asrkit features extract --join-seconds S --join-share
P`) teaches it to continue. The groups are planned from the manifest alone, in its order:
each run of consecutive utterances of one speaker is walked front to back, and an
utterance starts a joined group with probability `share` (a seeded draw per utterance),
which then takes the speaker's following utterances while the group stays within
`max_seconds`. Every utterance lands in exactly one item, alone or in one group, so an
epoch still holds each transcript once.

With `pause_seconds`, the parts of a group are separated as in a long recording: before
each following part a pause of faint noise, its length drawn uniformly from 0 to
`pause_seconds` (one seeded draw per utterance) and counted in the group's length, its
level drawn per group between -100 and -60 dB of full scale. A model that has heard only
sentences joined back to back may take a pause for the end of the speech.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np

from asrkit.data.manifest import Utterance


@dataclass(frozen=True)
class JoinSettings:
    max_seconds: float = 0.0  # 0: no joining
    share: float = 0.5  # of the utterances, the share that starts a joined group
    seed: int = 0
    pause_seconds: float = 0.0  # the longest pause between joined parts (0: back to back)

    def __post_init__(self):
        if self.max_seconds < 0 or not 0 <= self.share <= 1 or self.pause_seconds < 0:
            raise ValueError(
                "--join-seconds and --join-pause must be >= 0 and --join-share in [0, 1], "
                f"got {self.max_seconds}, {self.pause_seconds} and {self.share}"
            )

    def fingerprint(self) -> dict:
        """What the shards record; without pauses, the three keys alone (shards written
        without `pause_seconds` keep matching)."""
        settings = dataclasses.asdict(self)
        if not self.pause_seconds:
            del settings["pause_seconds"]
        return settings

    @property
    def enabled(self) -> bool:
        return self.max_seconds > 0 and self.share > 0


@dataclass(frozen=True)
class JoinedUtterance:
    """Utterances of one speaker, back to back or with a pause before each following part
    (`pauses`: seconds, one per part after the first, or empty): read and featurised as one."""

    parts: tuple[Utterance, ...]
    pauses: tuple[float, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.parts[0].id}+{len(self.parts) - 1}"

    @property
    def text(self) -> str:
        return " ".join(u.text for u in self.parts)

    @property
    def duration(self) -> float:
        return sum(u.duration for u in self.parts) + sum(self.pauses)

    def audio(self, pieces: list[np.ndarray], sample_rate: int) -> np.ndarray:
        """The parts' audio (`pieces`, in order) joined with the pauses: faint white noise at
        one level per group, drawn from the group's id (the same every time it is read)."""
        if not self.pauses:
            return np.concatenate(pieces)
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        level = 10 ** rng.uniform(-5, -3)
        joined = [pieces[0]]
        for pause, piece in zip(self.pauses, pieces[1:], strict=True):
            noise = level * rng.standard_normal(round(pause * sample_rate))
            joined += [noise.astype(piece.dtype), piece]
        return np.concatenate(joined)

    @property
    def speaker(self) -> str:
        return self.parts[0].speaker


def join_consecutive(
    utterances: list[Utterance], settings: JoinSettings
) -> list[Utterance | JoinedUtterance]:
    """The manifest's utterances with some consecutive ones of a speaker joined (see the
    module docstring); each utterance appears exactly once, the order kept."""
    if not settings.enabled:
        return list(utterances)
    draws = np.random.default_rng(settings.seed).random(len(utterances))
    gaps = np.random.default_rng([settings.seed, 1]).uniform(0, 1, len(utterances))
    gaps = np.round(gaps * settings.pause_seconds, 3)  # before utterance j, if it follows
    items: list[Utterance | JoinedUtterance] = []
    i = 0
    while i < len(utterances):
        group = [utterances[i]]
        if draws[i] < settings.share:
            total = utterances[i].duration
            j = i + 1
            while (
                j < len(utterances)
                and utterances[j].speaker == group[0].speaker
                and total + gaps[j] + utterances[j].duration <= settings.max_seconds
            ):
                total += gaps[j] + utterances[j].duration
                group.append(utterances[j])
                j += 1
        if len(group) == 1:
            items.append(group[0])
        else:
            pauses = (
                tuple(float(g) for g in gaps[i + 1 : i + len(group)])
                if settings.pause_seconds
                else ()
            )
            items.append(JoinedUtterance(tuple(group), pauses))
        i += len(group)
    return items

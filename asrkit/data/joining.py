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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asrkit.data.manifest import Utterance


@dataclass(frozen=True)
class JoinSettings:
    max_seconds: float = 0.0  # 0: no joining
    share: float = 0.5  # of the utterances, the share that starts a joined group
    seed: int = 0

    def __post_init__(self):
        if self.max_seconds < 0 or not 0 <= self.share <= 1:
            raise ValueError(
                "--join-seconds must be >= 0 and --join-share in [0, 1], got "
                f"{self.max_seconds} and {self.share}"
            )

    @property
    def enabled(self) -> bool:
        return self.max_seconds > 0 and self.share > 0


@dataclass(frozen=True)
class JoinedUtterance:
    """Utterances of one speaker, back to back: read and featurised as one."""

    parts: tuple[Utterance, ...]

    @property
    def id(self) -> str:
        return f"{self.parts[0].id}+{len(self.parts) - 1}"

    @property
    def text(self) -> str:
        return " ".join(u.text for u in self.parts)

    @property
    def duration(self) -> float:
        return sum(u.duration for u in self.parts)

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
                and total + utterances[j].duration <= settings.max_seconds
            ):
                total += utterances[j].duration
                group.append(utterances[j])
                j += 1
        items.append(group[0] if len(group) == 1 else JoinedUtterance(tuple(group)))
        i += len(group)
    return items

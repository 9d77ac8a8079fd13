"""Long recordings: how they are cut into overlapping windows at quiet points and joined
back by time (the rule `asrkit.decoding.windows_graph` carries out in the recogniser's
graph, with these settings).

A recording longer than `max_seconds` is cut at the quietest point (lowest short-time
energy, smoothed over `smooth_seconds` so a pause beats a stop consonant) within the last
`search_seconds` before each window would exceed `max_seconds`. Segment i runs from cut i to
cut i+1; the window decoded for it also holds `context_seconds` of audio on each side, so
the model hears the words around the cut. Each window keeps only the words whose start
time falls inside its own segment: a word near a cut is recognised by both neighbours and
kept by exactly one, and because cuts lie in pauses no word straddles one.

A window (its segment and the context on both sides) is kept within the longest
utterance the model was trained on (`windowing_for`): a transducer that has only heard
single sentences of 4 s drops most of what follows the first sentence of a 30 s window.
"""

from __future__ import annotations

from dataclasses import dataclass

ENERGY_HOP_SECONDS = 0.01


@dataclass(frozen=True)
class Windowing:
    max_seconds: float = 30.0  # recordings up to this long are decoded whole
    context_seconds: float = 1.0  # extra audio each side of a segment
    search_seconds: float = 5.0  # where to look for a quiet point, before max_seconds
    smooth_seconds: float = 0.2

    def __post_init__(self):
        if self.max_seconds <= 0 or self.context_seconds < 0 or self.smooth_seconds <= 0:
            raise ValueError(f"invalid long-audio windowing: {self}")
        if not 0 < self.search_seconds <= self.max_seconds / 2:
            raise ValueError(
                f"search_seconds must be in (0, max_seconds / 2]: {self.search_seconds} "
                f"with max_seconds {self.max_seconds}"
            )


DEFAULT_CONTEXT_SECONDS = 1.0


def windowing_for(
    trained_seconds: float | None,
    max_seconds: float | None = None,
    context_seconds: float | None = None,
) -> tuple[Windowing, str | None]:
    """The windowing for a model trained on utterances of up to `trained_seconds` (None:
    not known), with the user's `max_seconds` / `context_seconds` where given, and a
    warning when a window then exceeds what the model was trained on. By default a whole
    window (segment and both contexts) fits `trained_seconds`: the context is a tenth of
    it, at most 1 s."""
    if trained_seconds is None:
        context = DEFAULT_CONTEXT_SECONDS if context_seconds is None else context_seconds
        longest = Windowing.max_seconds if max_seconds is None else max_seconds
        return _windowing(longest, context), None
    if context_seconds is None:
        context = min(DEFAULT_CONTEXT_SECONDS, 0.1 * trained_seconds)
    else:
        context = context_seconds
    longest = trained_seconds - 2 * context if max_seconds is None else max_seconds
    if longest <= 0:
        longest = trained_seconds  # a context the user chose as long as the training audio
    window = longest + 2 * context
    warning = None
    if window > trained_seconds * 1.001:
        warning = (
            f"windows of up to {window:.1f} s (--max-seconds {longest:g} + 2 x "
            f"--context-seconds {context:g}) are longer than anything this model was trained on "
            f"({trained_seconds:.1f} s): it may drop words after a sentence end; the default "
            "keeps windows within it"
        )
    return _windowing(longest, context), warning


def _windowing(max_seconds: float, context_seconds: float) -> Windowing:
    return Windowing(
        max_seconds=max_seconds,
        context_seconds=context_seconds,
        search_seconds=min(5.0, max_seconds / 2),
    )

"""The clips of tests/data/realspeech as a fine-tuning set for an imported experiment:
their manifest, their features extracted with the import's config and tokenizer, and a
config based on the import's (an epoch at a negligible learning rate)."""

from __future__ import annotations

from pathlib import Path

from asrkit.audio import read_audio

ROOT = Path(__file__).resolve().parents[2]


def clip_finetuning(exp: Path, clips: list[str], lines: list[str]) -> list:
    """In the current directory: clips.jsonl, shards/clips and finetune.yaml for fine-tuning
    `exp` on `clips` (paths under the repository) with their transcripts `lines`; returns
    the utterances (upper-case references)."""
    from asrkit.cli.main import main
    from asrkit.data.manifest import Utterance, write_manifest

    utterances = [
        Utterance(Path(c).stem, str(ROOT / c), len(read_audio(ROOT / c, 16000)) / 16000,
                  line.upper(), "9002")
        for c, line in zip(clips, lines, strict=True)
    ]  # fmt: skip
    write_manifest("clips.jsonl", utterances)
    assert main(["features", "extract", "--manifest", "clips.jsonl", "--tokenizer",
                 str(exp / "tokenizer"), "--out", "shards/clips", "--shards", "1",
                 "--config", str(exp / "config.yaml")]) == 0  # fmt: skip
    Path("finetune.yaml").write_text(
        f"base: {exp / 'config.yaml'}\n"
        f"data: {{tokenizer: {exp / 'tokenizer'}, train_shards: shards/clips, "
        "dev_shards: shards/clips, batch_seconds: 40.0, num_buckets: 1, spec_augment: false}\n"
        "train: {epochs: 1, learning_rate: 1.0e-9, warmup_updates: 1, checkpoint_every: 0,\n"
        "        probe_memory: false}\n"
    )
    return utterances

"""An untrained experiment of another shape, for timing at published sizes without NeMo.

Copies an experiment's tokenizer, features and config (an imported NeMo model's too), applies
`--set` overrides to it (e.g. the encoder's width and depth), builds the network with random
weights and writes them as its one checkpoint. `--blank-bias B` adds B to the joint's blank
output, so that greedy search emits less often (a random network's emission rate flips
between every frame and none within a few tenths of B: time both ends).

    python tools/random_experiment.py --from EXP --out EXP115 --blank-bias 3 \\
        --set model.encoder.d_model=512 --set model.encoder.num_blocks=17 ...
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, help="an experiment directory")
    parser.add_argument("--out", required=True, help="the new experiment directory")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE")  # fmt: skip
    parser.add_argument("--blank-bias", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import keras

    from asrkit.checkpoints import TrainState, named_variables, write_weights
    from asrkit.config import dump_config
    from asrkit.experiment import CONFIG_FILE, build_network, load_experiment_config
    from asrkit.tokenizer import BLANK_ID, Tokenizer

    source, out = Path(args.source), Path(args.out)
    if out.exists():
        print(f"--out {out}: exists; choose a new directory", file=sys.stderr)
        return 2
    config = load_experiment_config(source, args.overrides)
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("checkpoints", "averaged"))
    recorded = load_experiment_config(out, args.overrides)
    header = "".join(
        line + "\n" for line in (source / CONFIG_FILE).read_text().splitlines()
        if line.startswith("#")
    )  # fmt: skip
    (out / CONFIG_FILE).write_text(header + dump_config(_relative_assets(recorded, out)))
    keras.utils.set_random_seed(args.seed)
    vocab = Tokenizer.load(config.data.tokenizer).vocab_size
    network = build_network(recorded, vocab)
    values = {name: v.numpy() for name, v in named_variables(network).items()}
    bias = next(k for k in values if k.startswith("joint.output_layer") and k.endswith("bias"))
    values[bias][BLANK_ID] += args.blank_bias
    write_weights(out / "checkpoints" / "ckpt-00000000", values, TrainState(0, 0, 0))
    parameters = sum(v.size for v in values.values())
    print(f"{out}: {parameters:,} parameters, random weights, blank bias {args.blank_bias:+g}")
    return 0


def _relative_assets(config, exp_dir: Path):
    """The config as an experiment records it: its tokenizer and CMVN inside it, relative."""
    import dataclasses

    data = config.data
    relative = {
        key: str(Path(getattr(data, key)).relative_to(exp_dir.resolve()))
        for key in ("tokenizer", "cmvn")
        if getattr(data, key) and Path(getattr(data, key)).is_relative_to(exp_dir.resolve())
    }
    return dataclasses.replace(config, data=dataclasses.replace(data, **relative))


if __name__ == "__main__":
    sys.exit(main())

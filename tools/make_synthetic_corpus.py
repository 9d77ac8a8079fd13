"""Make the built-in synthetic LibriSpeech-layout corpus (same as `asrkit corpus synth`).

python tools/make_synthetic_corpus.py --out data/synth --preset mini
"""

import argparse
import sys

from asrkit.cli.corpus import add_synth_arguments, run_synth

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_synth_arguments(parser)
    sys.exit(run_synth(parser.parse_args()))

"""Writes the PyTorch checkpoint fixtures of `tests/importers/` with torch itself.

Run with a Python that has torch (NeMo's venv, never asrkit's):

    /path/nemo-venv/bin/python tools/make_torch_fixtures.py --out tests/data/torch

`state_dict.ckpt` is a `torch.save`d OrderedDict of tensors of every storage type asrkit
reads, with a transposed (non-contiguous) view, two tensors sharing one storage and a
parameter; `state_dict.npz` holds the same values as torch computes them (bfloat16 widened
to float32). `malicious.ckpt` is a torch-format zip whose pickle calls `os.system` (it
must be refused without running).
"""

from __future__ import annotations

import argparse
import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/torch"))
    args = parser.parse_args()
    import numpy as np
    import torch

    torch.manual_seed(0)
    base = torch.randn(4, 6)
    state = OrderedDict(
        [
            ("encoder.weight", torch.nn.Parameter(torch.randn(3, 5))),
            ("encoder.bias", torch.randn(5)),
            ("transposed", base.t()),  # a strided view of base's storage
            ("row", base[2]),  # the same storage at an offset
            ("half", torch.randn(2, 3).half()),
            ("bf16", torch.randn(2, 2).bfloat16()),
            ("double", torch.randn(3).double()),
            ("steps", torch.tensor(7, dtype=torch.int64)),
            ("ints", torch.arange(5, dtype=torch.int32)),
            ("mask", torch.tensor([True, False, True])),
            ("empty", torch.zeros(0, 4)),
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(state, args.out / "state_dict.ckpt")
    expected = {k: (v.float() if v.dtype == torch.bfloat16 else v).detach().numpy()
                for k, v in state.items()}  # fmt: skip
    np.savez(args.out / "state_dict.npz", **expected)

    class Exploit:
        def __reduce__(self):
            import os

            return os.system, ("touch asrkit-pwned",)

    buffer = io.BytesIO()
    pickle.dump(OrderedDict(w=Exploit()), buffer, protocol=2)
    with zipfile.ZipFile(args.out / "malicious.ckpt", "w") as archive:
        archive.writestr("malicious/data.pkl", buffer.getvalue())
        archive.writestr("malicious/byteorder", "little")
        archive.writestr("malicious/version", "3\n")
    print(f"wrote {sorted(p.name for p in args.out.iterdir())}")


if __name__ == "__main__":
    main()

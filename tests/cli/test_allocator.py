"""The commands run TensorFlow with its BFC allocator for CPU tensors unless the user chose."""

import os
import subprocess
import sys

PROBE = (
    "import os, sys; from asrkit.cli.main import use_bfc_allocator; use_bfc_allocator(); "
    "print(os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'), 'tensorflow' in sys.modules)"
)


def _probe(**env):
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={**environment, **env}, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()


def test_the_bfc_allocator_is_the_default_and_a_users_choice_is_kept():
    assert _probe() == ["true", "False"]  # set before TensorFlow is imported
    assert _probe(TF_CPU_ALLOCATOR_USE_BFC="false") == ["false", "False"]

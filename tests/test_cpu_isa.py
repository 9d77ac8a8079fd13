"""Every reduced-precision test again under oneDNN's instruction-set cap, so that the kernels
of CPUs other than the one running the suite are exercised: bfloat16 emulated on AVX-512,
native AVX512-BF16, AMX where the CPU has it (the cap allows it; it cannot add it), and
TensorFlow's own Eigen kernels, which is what a CPU without AVX-512 gets for bfloat16.

Capping oneDNN at AVX2 while TensorFlow still sees AVX-512 in CPUID crashes TensorFlow's
bfloat16 MatMul (it hands the product to oneDNN, which then has no kernel for it): no real
CPU is in that state, so the AVX2 case switches TensorFlow's oneDNN paths off instead. The
same holds for float16 on a CPU with AVX512-FP16 (TensorFlow hands oneDNN its float16 MatMul,
which crashes under a cap below it): there the capped cases run the bfloat16 tests only."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

ISAS = {
    "amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"},
    "avx512_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2_eigen": {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0"},
}

# Each test whose expectation depends on how a CPU rounds in float16 or bfloat16.
PRECISION_TESTS = [
    "tests/models/test_layers.py::test_layer_runs_in_mixed_precision",
    "tests/models/test_layers.py::test_mixed_bfloat16_depthwise_convolutions_keep_float32_precision",
    "tests/models/test_fused.py",
    "tests/losses/test_fused.py::test_mixed_bfloat16_gradients_are_as_close_as_the_plain_layers",
    "tests/losses/test_fused.py::test_mixed_float16_hidden_states_keep_float32_logits",
    "tests/losses/test_rnnt.py::test_low_precision_logits_are_upcast",
    "tests/training/test_mixed_precision.py",
]


# The caps below AVX512-FP16 that keep TensorFlow's oneDNN paths on.
BELOW_FP16 = ("avx512_bf16", "avx512")


def _cpu_has(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("isa", list(ISAS))
def test_reduced_precision_tests_pass_under_each_instruction_set(isa):
    env = {**os.environ, **ISAS[isa], "ONEDNN_VERBOSE": "0"}
    env.pop("ASRKIT_TEST_DEADLINE", None)
    # the float16 tests: their names say float16, or loss scale (float16's alone)
    float16 = isa in BELOW_FP16 and _cpu_has("avx512_fp16")
    only = ["-k", "not float16 and not loss_scale"] if float16 else []
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
         "-o", "addopts=", *only, *PRECISION_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout

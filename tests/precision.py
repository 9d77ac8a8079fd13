"""How close a reduced-precision result must come to float32: a bound derived from the
format's unit roundoff and the number of rounded products on the way, not a tolerance tuned
to one CPU.

To first order, every product whose output is rounded to a format with unit roundoff u
adds a relative error of at most u, and the errors of a chain of d such products add up
(norms and residual sums carry a relative error through unchanged). So a network's output,
computed with its inputs rounded once and d rounded products on the way, lies within
(d + 1) * u of the float32 result in the norm over the whole output. An elementwise bound
would not hold: single elements near zero or after a cancellation can be off by many units
while the output as a whole is not, and which element that is depends on the order in which
the CPU's kernels (AVX-512, AVX512-BF16, AMX, Eigen) accumulate.
"""

import keras
import numpy as np

# Half the distance from 1 to the next number: 2^-(significand bits).
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


def unit_roundoff(policy_or_dtype: str) -> float:
    return UNIT_ROUNDOFF[keras.mixed_precision.Policy(policy_or_dtype).compute_dtype]


def rounded_products(layer: keras.layers.Layer) -> int:
    """The products whose outputs a reduced-precision policy rounds: one per kernel (dense,
    convolution, depthwise), and an attention's scores and context beside its projections."""
    kernels = [w for w in layer.weights if len(w.shape) >= 2]
    attentions = sum(1 for w in kernels if w.path.endswith("qkv/kernel"))
    return len(kernels) + 2 * attentions


def relative_error(got, want) -> float:
    got, want = (np.asarray(x, np.float64) for x in (got, want))
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def assert_within_rounding(got, want, unit: float, products: int, what: str = "") -> float:
    """Asserts ‖got - want‖ / ‖want‖ <= (products + 1) * unit; returns the error."""
    error = relative_error(got, want)
    bound = (products + 1) * unit
    assert error <= bound, f"{what}: relative error {error:.3g} over the bound {bound:.3g}"
    return error

"""trainer/memory.py against the CPU train step's measured peak RSS (bench/memory_bench.py).

Each shape runs in fresh processes at its batch and at one sequence; the activations the extra
sequences add are compared, since the step graph's own host memory (100-150 MiB, no GPU's
concern) and the optimizer state are the same at both.
"""

import pytest

from bench import memory_bench


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="the estimate is 13-23% under the measured CPU activations (docs/training.md): a "
    "tensor per block the memory rule does not account for yet",
)
def test_the_activation_estimate_is_within_15_percent_of_the_measured_at_three_shapes():
    found = {shape: memory_bench.compare(shape) for shape in memory_bench.SHAPES}
    off = {s: e / m - 1 for s, (m, e) in found.items() if abs(e / m - 1) > 0.15}
    assert not off, f"estimate / measured - 1 beyond 15%: {off}"

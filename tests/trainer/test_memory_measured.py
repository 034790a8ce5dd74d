"""trainer/memory.py against the CPU train step's measured peak (bench/memory_bench.py).

Each shape runs in fresh processes at its batch and at one sequence, and the peak bytes in use
of TensorFlow's allocator (the BFC allocator, as on a GPU) are compared: the activations the
extra sequences add, since the step graph's own memory, the optimizer state and the weight
copies are the same at both.
"""

import pytest

from bench import memory_bench


@pytest.mark.slow
def test_the_activation_estimate_is_within_15_percent_of_the_measured_at_three_shapes():
    found = {shape: memory_bench.compare(shape) for shape in memory_bench.SHAPES}
    off = {s: e / m - 1 for s, (m, e) in found.items() if abs(e / m - 1) > 0.15}
    assert not off, f"estimate / measured - 1 beyond 15%: {off}"

"""trainer/memory.py against the CPU train step's measured peak (bench/memory_bench.py).

Each shape runs in fresh processes at its batch and at one sequence, and the peak bytes in use
of TensorFlow's allocator (the BFC allocator, as on a GPU) are compared: the activations the
extra sequences add, since the step graph's own memory, the optimizer state and the weight
copies are the same at both.
"""

import pytest

from bench import memory_bench


@pytest.mark.slow
@pytest.mark.heavy  # about 20 s: with CI's heavy tier, to keep `make test` under 15 min
def test_the_activation_estimate_is_within_15_percent_of_the_measured():
    # One shape here, the one with the most terms (rotary positions, dropout, a large
    # vocabulary's logits): each takes two fresh TensorFlow processes, and `make bench`
    # (bench/memory_bench.py) holds all three shapes to the same 15%.
    measured, estimated = memory_bench.compare("logits")
    assert abs(estimated / measured - 1) <= 0.15, (measured, estimated)

"""Evaluate: the blessing decision and the text chunking, without a model."""

import math

from components.evaluate import executor
from components.evaluate.executor import Scores
from contracts.params import EvalPolicy

POLICY = EvalPolicy(max_nats_per_char=2.0, tolerance=0.01)


def scores(nats_per_char):
    return Scores(nats_per_char * 3, nats_per_char, math.exp(nats_per_char * 3), 100, 300)


def test_no_baseline_skips_the_change_check():
    blessed, reason = executor.decide(scores(1.5), None, POLICY)
    assert blessed and "no baseline" in reason


def test_threshold_is_absolute():
    blessed, reason = executor.decide(scores(2.5), None, POLICY)
    assert not blessed and "above the threshold" in reason


def test_small_regression_within_tolerance_is_blessed():
    assert executor.decide(scores(1.505), scores(1.5), POLICY)[0]


def test_regression_beyond_tolerance_is_not_blessed():
    blessed, reason = executor.decide(scores(1.6), scores(1.5), POLICY)
    assert not blessed and "worse than the baseline" in reason


def test_nan_and_divergence_are_never_blessed():
    assert not executor.decide(scores(float("nan")), None, POLICY)[0]
    blessed, reason = executor.decide(scores(1.0), None, POLICY, "NaN loss at step 3")
    assert not blessed and "diverged" in reason

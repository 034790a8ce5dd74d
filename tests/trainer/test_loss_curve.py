"""The trainer's loss curve, pinned: speed work must keep it within noise of the recorded one.

Recorded in float32, with this file's config on tests/tiny.py's corpus at the config's seed.
The data order is fixed by the seed (trainer/data.py), so a run repeats its curve exactly on one
machine. First recorded with the model and optimizer of commit 46564de (before the 2-D Dense
inputs and `auto` bfloat16 on CPU); float32 and mixed_bfloat16 agreed to 0.1% at every point, and
the 2-D Dense change to the fourth decimal. Re-recorded when the training order became
data.TrainOrder (an epoch-by-epoch order whose place a resumed run can compute): a new data
order, the same model. The old curve ended at 3.3772, the new one at 3.4652 (+2.6%;
mixed_bfloat16: 3.4652). The seed alone moves the end as much: with the new order, seeds 1, 2
and 3 end at 3.2648, 3.2791 and 3.3022. The tolerance leaves room for another CPU's kernels: a
model that stopped learning, or one that saw the future through a broken causal mask, is far
outside it.
"""

import json

import pytest

from contracts.artifacts import SERVING_DIR, TRAIN_HISTORY
from tests.tiny import TINY_OVERRIDES
from trainer.config import resolve_config
from trainer.precision import cpu_has_bf16
from trainer.task import train

CURVE = (
    "model.n_layer=2",
    "model.n_head=4",
    "model.d_model=64",
    "model.d_ff=256",
    "train.train_steps=60",
    "train.checkpoint_every=60",
    "train.learning_rate=3e-3",  # TINY_OVERRIDES' 1e-2 spikes on this corpus: a noisy pin
    "train.warmup_steps=10",
)
# Mean training loss at each logging step (log_every 10).
RECORDED = {10: 5.2973, 20: 4.6281, 30: 4.2080, 40: 3.8924, 50: 3.6493, 60: 3.4652}
TOLERANCE = 0.02


NATIVE_BF16 = pytest.mark.skipif(
    not cpu_has_bf16(), reason="bfloat16 is emulated on this CPU; `auto` never picks it here"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "precision", ["float32", pytest.param("mixed_bfloat16", marks=NATIVE_BF16)]
)
def test_the_loss_curve_stays_within_noise_of_the_recorded_one(examples, tmp_path, precision):
    import tf_keras as keras

    cfg = resolve_config("tiny", TINY_OVERRIDES + CURVE + (f"train.precision={precision}",))
    try:
        metrics = train(str(examples), str(tmp_path / "model"), str(tmp_path / "work"), cfg)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert metrics.precision_policy == precision
    history = json.loads((tmp_path / "model" / SERVING_DIR / TRAIN_HISTORY).read_text())
    losses = {p["step"]: p["loss"] for p in history["points"]}
    for step, recorded in RECORDED.items():
        assert losses[step] == pytest.approx(recorded, rel=TOLERANCE), (step, losses)

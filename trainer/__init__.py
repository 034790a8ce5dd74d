"""The GPT training program that runs inside training containers (`python -m trainer.task`).

Keras 3 cannot run MultiWorkerMirroredStrategy with `fit`, so tf-keras (Keras 2) is selected
here, before any module of this package can import TensorFlow.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

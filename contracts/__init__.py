"""What the parts of gptpipe agree on, TensorFlow- and KFP-free: errors, artifact layouts, and
what a training worker tells its launcher when it stops (termination.py).

The components, the pipeline and the trainer all import from here; nothing here imports them.
TFX keeps `standard_artifacts` and its path helpers apart from the components for the same reason.
"""

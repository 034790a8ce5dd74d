"""The Kubernetes job client: runs a distributed training job (`spec.JobSpec`) to the end, and
a program's indexed parts (`indexed/`, an `IndexedJobSpec`).

`launcher.py` is the interface alone (the `Launcher` protocol and its `LaunchResult`); beside
it are what a job is (`spec.py`), its names (`naming.py`), how it fails (`errors.py`) and how a
cancel reaches it (`cancel.py`). Two implementations share those semantics: `local.py` runs the
workers as processes on this machine, and `tfjob/` runs them as a Kubeflow Training Operator
TFJob, watched as a small state machine of steps. `kube.py` is the Kubernetes API client and the
pod's own identity, `placement.py` where a job started from a step's pod goes, `pods.py` what
every pod launched shares (restricted security, labels, a pinned image). `indexed/` runs one
program as N indexed parts, as processes or a batch/v1 Indexed Job (the tokenize step's). The
train step (components/train/executor.py, the one place that picks a launcher for training),
its exit handler (components/train/release.py), the tokenize step, `gptpipe gpu-bench`,
`gptpipe kfp` (run labels) and bench/ use it; it imports no step.
"""

"""Run one program as N indexed parts: local processes, or a Kubernetes batch/v1 Indexed Job.

Each part reads its index (0..completions-1) from `JOB_COMPLETION_INDEX`, as Kubernetes sets it
for an Indexed Job. `spec.py` is what such a job is (`IndexedJobSpec`), `launcher.py` the
interface alone (`IndexedLauncher`, `IndexedResult`); beside them `local.py` runs the parts as
processes here, and `job.py` as a batch/v1 Job, watched as steps (`manifest.py`, `api.py`,
`submit.py`, `watch.py`, `finish.py`, `cleanup.py`), as tfjob/ watches a TFJob. `make.py` is
the one place that picks an implementation, and places a job from the step's own pod.
Generic: the tokenize step (its encode parts) calls it, and it imports no step.
"""

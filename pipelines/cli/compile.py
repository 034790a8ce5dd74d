"""`gptpipe compile` and `gptpipe tfjob-manifest`: what a cluster gets, written out."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from contracts.params import TrainJob, apply_overrides
from pipelines.cli.options import (
    config_options,
    image_pull_secret_option,
    param_option,
    resolved_config,
)


def add_parser(sub: Any) -> None:
    """Add `compile` and `tfjob-manifest` to the `gptpipe` command's subparsers."""
    _add_compile(sub)
    _add_tfjob_manifest(sub)


def _add_compile(sub: Any) -> None:
    comp = sub.add_parser("compile", help="write the pipeline YAML for the KFP UI")
    comp.add_argument("--output", type=Path, required=True, help="YAML file to write")
    comp.add_argument(
        "--lock", type=Path, default=None, help="image digest lock (images/digests.json)"
    )
    comp.add_argument("--allow-unpinned", action="store_true", help="allow images without digests")
    comp.add_argument(
        "--pipeline-root",
        required=True,
        help="gs://BUCKET/PATH: KFP's pipeline root and artifact_root's default",
    )
    image_pull_secret_option(comp)
    config_options(comp)
    comp.set_defaults(func=_cmd_compile)


def _add_tfjob_manifest(sub: Any) -> None:
    tfjob = sub.add_parser("tfjob-manifest", help="print the TFJob manifest the train step submits")
    tfjob.add_argument("--workers", type=int, default=None, help="train_job.workers")
    tfjob.add_argument(
        "--gpus-per-worker", type=int, default=None, help="train_job.gpus_per_worker"
    )
    param_option(tfjob, "train_job.FIELD=VALUE: the train step's job (contracts.params.TrainJob)")
    tfjob.add_argument("--image", default=None, help="trainer image (default: the digest lock's)")
    config_options(tfjob)
    tfjob.add_argument("--examples", default="gs://BUCKET/examples", help="Examples artifact URI")
    tfjob.add_argument("--model-dir", default="gs://BUCKET/model", help="Model artifact URI")
    tfjob.add_argument("--work-dir", default="gs://BUCKET/work/RUN/train", help="checkpoints")
    tfjob.add_argument("--run-id", default="manual", help="pipeline run id (names the job)")
    tfjob.add_argument(
        "--namespace",
        default="kubeflow",
        help="the run's namespace (default kubeflow: single-user KFP; else your profile): the "
        "job's, and whose KFP step account its pods run as",
    )
    tfjob.add_argument("--allow-unpinned", action="store_true", help="allow an image by tag")
    tfjob.set_defaults(func=_cmd_tfjob_manifest)


def _cmd_compile(args: argparse.Namespace) -> int:
    from pipelines import compiler
    from pipelines.pipeline import Target

    images = compiler.load_images(args.lock, allow_unpinned=args.allow_unpinned)
    target = Target(
        images,
        pipeline_root=args.pipeline_root,
        image_pull_secrets=tuple(args.image_pull_secrets),
    )
    path = compiler.compile_pipeline(args.output, target, resolved_config(args))
    print(f"wrote {path}")
    return 0


def _cmd_tfjob_manifest(args: argparse.Namespace) -> int:
    from components.jobs.placement import kfp_step_account
    from components.jobs.tfjob import manifest as tfjob_manifest
    from components.train import executor
    from pipelines import compiler

    image = args.image or compiler.load_images(allow_unpinned=args.allow_unpinned).trainer
    shortcuts = [
        f"train_job.{name}={value}"
        for name, value in (("workers", args.workers), ("gpus_per_worker", args.gpus_per_worker))
        if value is not None
    ]
    job = apply_overrides({"train_job": TrainJob()}, [*shortcuts, *args.params])["train_job"]
    assert isinstance(job, TrainJob)
    # What the train step gives the job in a step pod of `--namespace` (cluster_placement):
    # the namespace, and the run's account or the step's own, KFP's; not the owner reference
    # to the step pod, which only a running step has.
    spec = executor.job_spec(
        args.examples,
        args.model_dir,
        args.work_dir,
        resolved_config(args),
        launcher="tfjob",
        run_id=args.run_id,
        image=image,
        namespace=args.namespace,
        service_account=job.service_account or kfp_step_account(args.namespace),
        **job.job_fields(),
    )
    if args.allow_unpinned:
        spec = dataclasses.replace(spec, allow_unpinned=True)
    print(tfjob_manifest.render_yaml(spec), end="")
    return 0

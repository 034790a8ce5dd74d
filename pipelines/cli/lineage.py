"""`gptpipe lineage` and `gptpipe reproduce`: what produced a pushed model, and how to redo it.

Both read the chain the steps recorded in ML Metadata (through `components.lineage`, never
MLMD directly): PushedModel <- push <- Model <- train <- Examples <- tokenize, plus the
evaluation that blessed the model and the baseline it was compared with.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from components import lineage, provenance, serving, storage
from contracts.errors import UserError
from contracts.examples import LocalSource, Source, parse_sources
from contracts.params import STEP_PARAMS, TokenizeParams, params_class
from pipelines.cli.options import image_pull_secret_option
from pipelines.config import DEFAULT_ROOT
from pipelines.pipeline import Images, Target, build
from trainer.config import Config, config_from_dict

MAX_ROLLBACKS = 100  # rollbacks of rollbacks `trace` follows back to the push that trained
# Execution properties the lineage report shows for every execution.
_PROVENANCE = (
    "image",
    "image_digest",
    "unpinned",
    "image_digest_observed",
    "image_digest_mismatch",
    "code_version",
    "environment_digest",
    "run_id",
    "start_time_ms",
    "end_time_ms",
    "cached_from_run_id",
)


def store_address(root: str | None, mlmd: str | None) -> str:
    """The ML Metadata store to read: a gRPC host:port, or ROOT/metadata.sqlite (default ./runs)."""
    if mlmd:
        return mlmd
    path = Path(root or DEFAULT_ROOT) / "metadata.sqlite"
    if not path.is_file():
        raise UserError(
            f"no metadata store at {path}: pass --root of a local run or --mlmd HOST:PORT"
        )
    return str(path.resolve())


def resolve_model(store_uri: str, model_uri: str | None, latest: bool) -> str:
    """The PushedModel URI to start from: the one given (a serving folder: its newest complete
    version), or the latest pushed with --latest."""
    if latest and model_uri:
        raise UserError(f"give a MODEL_URI ({model_uri}) or --latest, not both")
    if latest:
        found = lineage.latest_pushed_model(store_uri)
        if found is None:
            raise UserError(f"no pushed model in metadata store {store_uri}")
        return found
    if not model_uri:
        raise UserError("give a MODEL_URI (e.g. runs/serving/gpt/1) or --latest")
    uri = model_uri.rstrip("/") if storage.is_gcs(model_uri) else str(Path(model_uri).resolve())
    # A serving folder stands for the version it serves: the pushes that published nothing
    # are recorded at the folder itself, and the newest of those is not the model in service.
    return serving.latest_version_uri(uri) or uri


# --- lineage -------------------------------------------------------------------------------


def trace(store_uri: str, pushed_model_uri: str) -> dict[str, Any]:
    """Walk back from a pushed model to the data it was trained on, as lineage views.

    PushedModel <- push <- Model (+ ModelBlessing <- evaluate -> ModelEvaluation)
    <- train <- Examples <- tokenize. A link the store lacks is None.
    """
    pushed = lineage.find_artifact(store_uri, pushed_model_uri, lineage.PUSHED_MODEL_TYPE)
    if pushed is None:
        raise UserError(
            f"no PushedModel at {pushed_model_uri!r} in metadata store {store_uri}: "
            "pass the URI of a push step's output"
        )
    push = lineage.producer_of(store_uri, pushed)
    push_inputs = lineage.inputs_of(store_uri, push) if push else {}
    # A rollback's input is the version it restored (a PushedModel), not a Model: its chain
    # is that version's own, rollbacks of rollbacks included.
    restored: list[str] = []
    while len(restored) < MAX_ROLLBACKS:
        earlier = _pick(push_inputs, lineage.PUSHED_MODEL_TYPE, "model")
        if earlier is None:
            break
        restored.append(earlier["uri"])
        restoring = lineage.producer_of(store_uri, earlier)
        push_inputs = lineage.inputs_of(store_uri, restoring) if restoring else {}
    model = _pick(push_inputs, lineage.MODEL_TYPE, "model")
    blessing = _pick(push_inputs, lineage.MODEL_BLESSING_TYPE, "blessing")
    evaluate = lineage.producer_of(store_uri, blessing) if blessing else None
    evaluate_outputs = lineage.outputs_of(store_uri, evaluate) if evaluate else {}
    train = lineage.producer_of(store_uri, model) if model else None
    train_inputs = lineage.inputs_of(store_uri, train) if train else {}
    examples = _pick(train_inputs, lineage.EXAMPLES_TYPE, "examples")
    return {
        "pushed_model": pushed,
        "push": push,
        "restored_from": restored,  # the versions a rollback restored, newest first
        "model": model,
        "blessing": blessing,
        "evaluate": evaluate,
        "evaluations": [
            a
            for arts in evaluate_outputs.values()
            for a in arts
            if a["type_name"] == lineage.MODEL_EVALUATION_TYPE
        ],
        "train": train,
        "examples": examples,
        "tokenize": lineage.producer_of(store_uri, examples) if examples else None,
        "dataset_version": examples["properties"].get("dataset_version") if examples else None,
    }


def _pick(
    linked: dict[str, list[lineage.ArtifactView]], type_name: str, key: str
) -> lineage.ArtifactView | None:
    """The artifact under `key` if it has that type, else the first of that type."""
    candidates = [a for a in linked.get(key, []) if a["type_name"] == type_name]
    candidates += [a for arts in linked.values() for a in arts if a["type_name"] == type_name]
    return candidates[0] if candidates else None


def report(store_uri: str, pushed_model_uri: str) -> dict[str, Any]:
    """The chain behind a pushed model as plain JSON-able values (the `--json` output)."""
    chain = trace(store_uri, pushed_model_uri)
    pushed = chain["pushed_model"]["properties"]
    return {
        "store": store_uri,
        "pushed_model": {
            "uri": chain["pushed_model"]["uri"],
            "pushed": pushed.get("pushed"),
            "destination": pushed.get("pushed_destination"),
            "version": pushed.get("pushed_version"),
            "push": _execution(chain["push"]),
            "restored_from": chain["restored_from"],
        },
        "model": _artifact(chain["model"]),
        "train": _train(chain["train"]),
        "examples": _examples(chain["examples"]),
        "tokenize": _execution(chain["tokenize"]),
        "evaluation": _evaluation(chain),
    }


def _execution(view: lineage.ExecutionView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    props = view["properties"]
    found = {"id": view["id"], "step": view["step"], "state": view["state"]}
    found.update({key: props[key] for key in _PROVENANCE if key in props})
    found["parameters"] = as_set(lineage.parameters_of(view))
    return found


def as_set(parameters: dict[str, Any]) -> dict[str, Any]:
    """Recorded parameters as the user set them. KFP carries a dict parameter as a protobuf
    Struct, whose every number is a double (`"n_layer": 3.0`): the config and each step
    parameter object are read back through their own classes, which know the integers, under
    the keys recorded. A value they refuse (another version's) stays as recorded."""
    found = dict(parameters)
    for name, value in parameters.items():
        cls = params_class(name)
        if not isinstance(value, dict) or (cls is None and name != "config"):
            continue
        try:
            typed = cls.from_dict(value).to_dict() if cls else asdict(config_from_dict(value))
        except UserError:
            continue
        found[name] = {
            key: {k: typed[key][k] for k in part} if name == "config" else typed[key]
            for key, part in value.items()
        }
    return found


def _artifact(view: lineage.ArtifactView | None) -> dict[str, Any] | None:
    return None if view is None else {"uri": view["uri"], "properties": view["properties"]}


def _train(view: lineage.ExecutionView | None) -> dict[str, Any] | None:
    found = _execution(view)
    if view is None or found is None:
        return None
    props = view["properties"]
    found.update(
        trainer_image=found["parameters"].get("trainer_image"),
        worker_image_digests=_json(props.get("worker_image_digests"), {}),
        gpu_hours=props.get("gpu_hours"),
        job_name=props.get("job_name"),
    )
    return found


def _examples(view: lineage.ArtifactView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    props = view["properties"]
    return {
        "uri": view["uri"],
        "dataset_version": props.get("dataset_version"),
        "sources": _json(props.get("sources"), []),
        "windows": props.get("windows"),
        "tokens": props.get("tokens"),
        "tokenizer_sha256": props.get("tokenizer_sha256"),
        "splits": {
            split: {k: props.get(f"{split}_{k}") for k in ("windows", "tokens", "chars")}
            for split in _json(props.get("split_names"), [])
        },
    }


def _evaluation(chain: dict[str, Any]) -> dict[str, Any] | None:
    blessing = chain["blessing"]
    if blessing is None:
        return None
    metrics = chain["evaluations"][0] if chain["evaluations"] else None
    props = blessing["properties"]
    return {
        "execution": _execution(chain["evaluate"]),
        "metrics": metrics["properties"] if metrics else {},
        "blessed": props.get("blessed"),
        "reason": props.get("reason"),
        "baseline_model": props.get("baseline_model") or None,
    }


def _json(value: Any, default: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value else default


def print_report(found: dict[str, Any]) -> None:
    """The chain as a rich tree, from the pushed model down to its data."""
    from rich.console import Console
    from rich.tree import Tree

    pushed = found["pushed_model"]
    tree = Tree(
        f"[bold]PushedModel[/] {pushed['uri']} (version {pushed['version']}, "
        f"pushed={pushed['pushed']})"
    )
    _add_execution(tree, "push", pushed["push"])
    for uri in pushed["restored_from"]:
        tree.add(f"a rollback: restores version {uri.rstrip('/').rsplit('/', 1)[-1]} ({uri})")
    model = tree.add(f"[bold]Model[/] {(found['model'] or {}).get('uri', 'not recorded')}")
    train = found["train"]
    node = _add_execution(model, "train", train)
    if node is not None and train is not None:
        node.add(
            f"trainer image {train['trainer_image']}; job {train['job_name']}; "
            f"GPU-hours {train['gpu_hours']}"
        )
        for pod, digest in train["worker_image_digests"].items():
            node.add(f"worker {pod}: {digest}")
    examples = found["examples"]
    if examples is not None:
        data = model.add(f"[bold]Examples[/] {examples['uri']}")
        data.add(
            f"dataset version {examples['dataset_version']}; "
            f"{examples['tokens']} tokens, {examples['windows']} windows"
        )
        for source in examples["sources"]:
            data.add(f"source {_source_line(source)}")
        _add_execution(data, "tokenize", found["tokenize"])
    evaluation = found["evaluation"]
    if evaluation is not None:
        node = tree.add(
            f"[bold]Evaluation[/] blessed={evaluation['blessed']}: {evaluation['reason']}"
        )
        node.add(f"baseline {evaluation['baseline_model'] or 'none (first model)'}")
        for name, value in sorted(evaluation["metrics"].items()):
            node.add(f"{name} = {value}")
    Console().print(tree)


def _add_execution(parent: Any, name: str, found: dict[str, Any] | None) -> Any:
    if found is None:
        parent.add(f"[bold]{name}[/] not recorded")
        return None
    pin = found.get("image_digest") or "UNPINNED"
    node = parent.add(
        f"[bold]{name}[/] execution {found['id']} {found['state']}, run {found.get('run_id')}"
    )
    node.add(f"image {found.get('image')} ({pin}); code {found.get('code_version')}")
    if found.get("image_digest_mismatch"):
        node.add(f"[red]pod ran {found.get('image_digest_observed')}[/]")
    node.add("parameters " + json.dumps(found["parameters"], sort_keys=True))
    return node


def _source_line(source: dict[str, Any]) -> str:
    keys = ("size", "sha256", "generation", "crc32c")
    return source["uri"] + " " + " ".join(f"{k}={source[k]}" for k in keys if source.get(k))


# --- reproduce -----------------------------------------------------------------------------


def reproduce(
    store_uri: str,
    pushed_model_uri: str,
    output: str | Path,
    *,
    allow_unpinned: bool = False,
    image_pull_secrets: tuple[str, ...] = (),
) -> tuple[Path, Path]:
    """Write a compiled pipeline and its arguments that redo the run behind a pushed model.

    Same images by digest, same parameters, same corpus URIs; refused (UserError) when a
    source no longer matches its recorded fingerprint. `image_pull_secrets` are compiled in as
    `gptpipe compile --image-pull-secret` does (lineage does not record the original run's).
    Returns (pipeline YAML, params JSON).
    """
    from pipelines import compiler

    found = report(store_uri, pushed_model_uri)
    steps = {
        "tokenize": found["tokenize"],
        "train": found["train"],
        "evaluate": (found["evaluation"] or {}).get("execution"),
    }
    missing = [name for name, execution in steps.items() if execution is None]
    if missing or found["examples"] is None:
        lacks = ", ".join(missing or [lineage.EXAMPLES_TYPE])
        raise UserError(
            f"the lineage of {pushed_model_uri} lacks {lacks} (a partial record): "
            "reproduce the model that the original push published"
        )
    arguments = recorded_arguments(
        {step: execution["parameters"] for step, execution in steps.items()}  # type: ignore[index]
    )
    # No `metadata` argument: the address read from (--mlmd, often a port-forward to
    # localhost) is seldom one the steps' pods can reach; they record where the pipeline's
    # default says, the cluster's own store (docs/lineage.md).
    images = Images(pipeline=found["train"]["image"], trainer=found["train"]["trainer_image"])
    _check_pinned(images, allow_unpinned)
    config = check_config(arguments["config"], steps["train"]["parameters"])  # type: ignore[index]
    recorded = parse_sources(found["examples"]["sources"], "the Examples' recorded sources")
    check_sources(arguments["corpus"], recorded, found["examples"]["dataset_version"])
    given = TokenizeParams.from_dict(arguments[TokenizeParams.NAME]).tokenizer
    if given:
        check_tokenizer(given, found["examples"])
    root = str(arguments.get("artifact_root", ""))
    target = Target(
        images,
        pipeline_root=root if storage.is_gcs(root) else "",
        image_pull_secrets=image_pull_secrets,
    )
    pipeline = compiler.compile_pipeline(output, target, config)
    params = Path(output).with_suffix(".params.json")
    params.write_text(
        json.dumps(
            {
                "arguments": arguments,
                "reproduces": {
                    "pushed_model": found["pushed_model"]["uri"],
                    "run_id": found["train"].get("run_id"),
                    "dataset_version": found["examples"]["dataset_version"],
                    "code_version": found["train"].get("code_version"),
                    "images": {"pipeline": images.pipeline, "trainer": images.trainer},
                },
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return pipeline, params


def recorded_arguments(recorded: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The pipeline's arguments of a run, from the parameters its steps recorded (by step).

    Each step records its inputs by their names in the pipeline; those that are the pipeline's
    own parameters are its arguments. Each step parameter object (`contracts.params`) must be
    there and read back; a run recorded before they existed is refused in one line.
    """
    declared = build(Target(Images("", "")), Config()).component_spec.inputs or {}
    arguments = {
        name: value
        for parameters in recorded.values()
        for name, value in parameters.items()
        if name in declared and name != "metadata"
    }
    for cls in STEP_PARAMS:
        if cls.NAME not in arguments:
            raise UserError(
                f"the run recorded no {cls.NAME} parameters: it predates one parameter object "
                "per step, so it cannot be redone from its record; rerun it with `gptpipe run`"
            )
        cls.from_dict(arguments[cls.NAME])
    return arguments


def check_config(config: Any, train_parameters: dict[str, Any]) -> Config:
    """The recorded resolved config, refused unless it is complete and hashes as train recorded.

    The config travels resolved (values, not a preset name or a YAML path), so the run is
    redone from the record alone; a record without it predates that and cannot be.
    """
    from trainer.config import config_from_dict, config_hash

    if not isinstance(config, dict):
        raise UserError(
            f"the recorded config is {config!r}, not a resolved config: the run predates "
            "resolved configs in lineage; rerun it with `gptpipe run` instead"
        )
    cfg = config_from_dict(config)
    recorded = train_parameters.get("config_hash")
    if recorded and recorded != config_hash(cfg):
        raise UserError(
            f"the recorded config hashes to {config_hash(cfg)[:12]}, but train recorded "
            f"{str(recorded)[:12]}: the lineage record is inconsistent"
        )
    return cfg


def _check_pinned(images: Images, allow_unpinned: bool) -> None:
    for name, ref in (("pipeline", images.pipeline), ("trainer", images.trainer)):
        if not provenance.is_pinned(ref) and not allow_unpinned:
            raise UserError(
                f"the recorded {name} image {ref!r} has no digest, so the same image "
                "cannot be named again; pass --allow-unpinned to reuse the reference"
            )


def check_sources(corpus: str, recorded: Sequence[Source], dataset_version: str) -> None:
    """Raise UserError unless `corpus` lists exactly the recorded sources, unchanged."""
    try:
        current = {f.uri: f for f in storage.list_files(corpus)}
    except UserError:  # the corpus itself is gone: say which recorded source is missing
        current = {}
    version = f"dataset version {dataset_version[:12]}"
    for source in recorded:
        uri = source.uri
        if uri not in current:
            raise UserError(f"source {uri} of {version} is gone: the data cannot be reproduced")
        changed = _fingerprint_change(source, current[uri])
        if changed:
            raise UserError(
                f"source {uri} changed since {version} was made ({changed}): "
                "the same data version cannot be reproduced from it"
            )
    extra = sorted(set(current) - {s.uri for s in recorded})
    if extra:
        raise UserError(
            f"corpus {corpus!r} now also holds {extra[0]}, which {version} did not "
            "include: the same data version cannot be reproduced from it"
        )


def check_tokenizer(uri: str, examples: dict[str, Any]) -> None:
    """Raise UserError unless the given tokenizer at `uri` is the one the dataset version was
    made with (its bytes' sha256, which the version hashes too)."""
    version = f"dataset version {str(examples['dataset_version'])[:12]}"
    try:
        data = storage.read_bytes(uri)
    except (OSError, UserError):
        raise UserError(
            f"tokenizer {uri} of {version} is gone: the data cannot be reproduced"
        ) from None
    recorded, now = examples.get("tokenizer_sha256"), hashlib.sha256(data).hexdigest()
    if recorded and now != recorded:
        raise UserError(
            f"tokenizer {uri} changed since {version} was made (sha256 {recorded[:12]} -> "
            f"{now[:12]}): the same data version cannot be reproduced from it"
        )


def _fingerprint_change(recorded: Source, now: storage.FileInfo) -> str:
    """'' if the content fingerprint still matches, else what differs."""
    keys = ("size", "sha256") if isinstance(recorded, LocalSource) else ("size", "crc32c", "md5")
    diffs = [
        f"{k} {getattr(recorded, k)} -> {getattr(now, k)}"
        for k in keys
        if getattr(recorded, k) != getattr(now, k)
    ]
    return "; ".join(diffs)


# ---- the commands ------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Add `lineage` and `reproduce` to the `gptpipe` command's subparsers."""
    _add_lineage(sub)
    _add_reproduce(sub)


def _add_lineage(sub: Any) -> None:
    lin = sub.add_parser("lineage", help="what produced a pushed model, back to its data")
    lin.add_argument(
        "model_uri",
        nargs="?",
        metavar="MODEL_URI",
        help="a pushed model version (e.g. runs/serving/gpt/1)",
    )
    lin.add_argument("--latest", action="store_true", help="the most recently pushed model")
    _store_options(lin)
    lin.add_argument("--json", action="store_true", help="print the chain as JSON")
    lin.set_defaults(func=_cmd_lineage)


def _add_reproduce(sub: Any) -> None:
    rep = sub.add_parser("reproduce", help="write a pipeline + arguments that redo a model's run")
    rep.add_argument("model_uri", metavar="MODEL_URI", help="a pushed model version")
    rep.add_argument(
        "--output",
        type=Path,
        required=True,
        help="pipeline YAML to write; its arguments go to OUTPUT.params.json",
    )
    _store_options(rep)
    rep.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="reuse recorded image references that carry no digest",
    )
    image_pull_secret_option(rep)  # lineage does not record the original run's
    rep.set_defaults(func=_cmd_reproduce)


def _store_options(parser: argparse.ArgumentParser) -> None:
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--root", default=None, help="local run root (default ./runs)")
    store.add_argument(
        "--mlmd",
        default=None,
        metavar="HOST:PORT",
        help="an ML Metadata gRPC service, e.g. metadata-grpc-service.kubeflow:8080",
    )


def _cmd_lineage(args: argparse.Namespace) -> int:
    store = store_address(args.root, args.mlmd)
    found = report(store, resolve_model(store, args.model_uri, args.latest))
    if args.json:
        print(json.dumps(found, indent=2, sort_keys=True, default=str))
    else:
        print_report(found)
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    store = store_address(args.root, args.mlmd)
    model = resolve_model(store, args.model_uri, latest=False)
    pipeline, params = reproduce(
        store,
        model,
        args.output,
        allow_unpinned=args.allow_unpinned,
        image_pull_secrets=tuple(args.image_pull_secrets),
    )
    print(f"wrote {pipeline} and {params}")
    return 0

"""`gptpipe generate` and `gptpipe score`: try a model through its SavedModel signatures.

`--model` names a TF Serving destination (`runs/serving/gpt`, `gs://bucket/serving/gpt`), whose
newest complete version is used unless `--version N` picks one, or a SavedModel folder itself.
A gs:// model is first downloaded to a temporary folder through the storage layer, as evaluate
does with its baseline: TensorFlow's own GCS file system needs Google credentials and ignores
STORAGE_EMULATOR_HOST. Both commands call only the signatures of the contract in
docs/design.md, so they work on every model a run pushed.

`--endpoint URL` runs the same signatures on a served model instead, through TF Serving's REST
API (`server.client`): `gptpipe serve` here, TF Serving on a cluster. The two paths share the
choice of signature and inputs (`generate_call`) and the scoring (evaluate's chunks, through
`outputs_scorer`), so a seeded generate gives the same text and a score the same figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.artifacts import SAVED_MODEL_FILE, SERVING_DIR, SIGNATURES
from contracts.errors import UserError
from pipelines.config import DEFAULT_ROOT, RunConfig

if TYPE_CHECKING:
    from components.evaluate.scoring import ScoreBatch
    from contracts.blessing import Scores
    from server.client import RestModel

# The components (storage, serving, evaluate with TensorFlow) are imported where they are used,
# as main.py does, so adding these commands' parsers costs `gptpipe` nothing at start-up.

DEFAULT_MODEL = str(DEFAULT_ROOT / "serving" / RunConfig().model_name)  # where `run --local` pushes
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_TEMPERATURE = 0.8
GENERATE_SIGNATURES = ("generate", "generate_seeded")
# The generate signatures' inputs and their dtypes (trainer/export.py; docs/design.md).
GENERATE_DTYPES = {
    "prompt": "string",
    "max_new_tokens": "int32",
    "temperature": "float32",
    "seed": "int64",
    "stop_at_eos": "bool",
}


def add_parser(subparsers: Any) -> None:
    """Add `generate` and `score` to the `gptpipe` command's subparsers."""
    gen = subparsers.add_parser("generate", help="continue a prompt with a served model")
    _model_options(gen)
    gen.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help=f"tokens to generate (default {DEFAULT_MAX_NEW_TOKENS})",
    )
    gen.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help=f"sampling temperature, above 0 (default {DEFAULT_TEMPERATURE})",
    )
    gen.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sample from this seed (the same seed, the same continuation); without it, "
        "from the model's own random state",
    )
    gen.add_argument(
        "--through-eos",
        action="store_true",
        help="continue past the end of the document (EOS) into a new one; by default the "
        "continuation ends there",
    )
    gen.add_argument("prompt", help="the text to continue")
    gen.set_defaults(func=cmd_generate)

    sco = subparsers.add_parser("score", help="a served model's nats per character on a file")
    _model_options(sco)
    sco.add_argument("file", type=Path, metavar="FILE", help="UTF-8 text to score")
    sco.add_argument("--json", action="store_true", help="print the scores as JSON")
    sco.set_defaults(func=cmd_score)


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help=f"serving folder or SavedModel folder, local or gs:// (default {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--version", type=int, default=None, help="version to use (default: the newest complete)"
    )
    parser.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="a served model instead of --model, through TF Serving's REST API: "
        "http://HOST:PORT (`gptpipe serve`'s default http://127.0.0.1:8501) or "
        "http://HOST:PORT/v1/models/NAME[/versions/N]",
    )
    parser.add_argument(
        "--name", default=None, help="the model's name at --endpoint http://HOST:PORT (default gpt)"
    )


def cmd_generate(args: argparse.Namespace) -> int:
    """Print the model's continuation of the prompt."""
    check_sampling(args.max_new_tokens, args.temperature, args.seed)
    sampling = (args.prompt, args.max_new_tokens, args.temperature, args.seed)
    stop_at_eos = not args.through_eos
    client = _client(args)
    if client is not None:
        with contextlib.closing(client):
            print(generate_remote(client, *sampling, stop_at_eos=stop_at_eos))
        return 0
    uri = resolve_model(args.model or DEFAULT_MODEL, args.version)
    with open_model(uri) as model:
        print(generate(model, *sampling, stop_at_eos=stop_at_eos))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    """Print the model's nats per character on a text file."""
    from components.evaluate.scoring import signature_scorer

    text = read_text(args.file)
    client = _client(args, pin=True)
    if client is not None:
        with contextlib.closing(client):
            scorer = remote_scorer(client)
            scores = score(scorer, text, args.file)
            uri = client.model_url
    else:
        uri = resolve_model(args.model or DEFAULT_MODEL, args.version)
        with open_model(uri) as model:
            scores = score(signature_scorer(model), text, args.file)
    if args.json:
        found = {"model": uri, "file": str(args.file), **dataclasses.asdict(scores)}
        print(json.dumps({k: _json_number(v) for k, v in found.items()}, indent=2))
    else:
        print(
            f"{scores.nats_per_char:.4f} nats/char on {args.file} ({scores.chars} chars; "
            f"{scores.nats_per_token:.4f} nats/token over {scores.tokens} tokens) by {uri}"
        )
    return 0


# ---- which model ----------------------------------------------------------------------------


def _client(args: argparse.Namespace, pin: bool = False) -> RestModel | None:
    """The REST client --endpoint names (with --name and --version), or None without it.
    With `pin`, every request goes to the version served when it starts (a score of many
    requests is one model's)."""
    if args.endpoint is None:
        if args.name is not None:
            raise UserError("--name names the model at --endpoint: pass --endpoint too")
        return None
    if args.model is not None:
        raise UserError("--model and --endpoint both name a model: pass one")
    from server.client import RestModel, parse_endpoint

    return RestModel(parse_endpoint(args.endpoint, args.name, args.version), pin=pin)


def resolve_model(model: str, version: int | None) -> str:
    """The SavedModel folder that --model and --version name (a local path or gs:// URI).

    A folder holding `saved_model.pb` is a SavedModel; a Model artifact (holding one in
    Format-Serving/) must be complete (its COMPLETE marker), as evaluate and push require.
    Otherwise it is a TF Serving destination and the newest complete version (or `version`) is
    taken. What is not there is a UserError.
    """
    from components import serving, storage
    from components.model_artifact import require_complete

    model = serving.normalize(model)
    if version is None and _is_saved_model(storage.join(model, SERVING_DIR)):
        require_complete(model)  # a Model artifact (a run's model/ folder): its SavedModel
        return storage.join(model, SERVING_DIR)
    if version is None and _is_saved_model(model):
        path = model.rstrip("/") if storage.is_gcs(model) else str(Path(model).resolve())
        parent, _, name = path.rpartition("/")
        if name == SERVING_DIR:  # inside a Model artifact: complete only with it
            require_complete(parent)
        return model
    if not _exists(model):
        raise UserError(
            f"no model at {model}: pass --model, a serving folder (such as runs/serving/gpt, "
            "after `gptpipe run --local`) or a SavedModel folder"
        )
    versions = serving.serving_versions(model)
    if version is not None:
        if version not in versions:
            raise UserError(
                f"version {version} of {model} is not a complete model version; its complete "
                f"versions are {versions or 'none'}"
            )
        return storage.join(model, str(version))
    if not versions:
        raise UserError(
            f"{model} is not a SavedModel folder (no {SAVED_MODEL_FILE}) and has no complete "
            f"model versions (folders <N>/ holding {SAVED_MODEL_FILE}): push a model there, or "
            "pass a SavedModel folder"
        )
    return storage.join(model, str(versions[-1]))


def _is_saved_model(uri: str) -> bool:
    from components import storage

    return storage.has_content(storage.join(uri, SAVED_MODEL_FILE))


def _exists(uri: str) -> bool:
    """A local path that exists (an empty folder too), or a gs:// prefix with objects under it."""
    from components import storage

    return storage.has_content(uri) if storage.is_gcs(uri) else Path(uri).exists()


@contextlib.contextmanager
def open_model(uri: str) -> Iterator[Any]:
    """The loaded SavedModel at `uri`; a gs:// one is read from a temporary local copy.

    One that cannot be loaded, or lacks the `generate` and `score` signatures, is a UserError.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- registers the in-graph SentencePiece ops

    from components import storage

    with storage.local_copy(uri) as local:
        try:
            model = tf.saved_model.load(str(local))
        except (OSError, ValueError, IndexError, tf.errors.OpError) as err:
            raise UserError(
                f"{uri} is not a SavedModel that loads ({_first_line(err)}): pass a model "
                "version a run pushed"
            ) from None
        missing = [name for name in SIGNATURES if name not in model.signatures]
        if missing:
            raise UserError(
                f"the SavedModel at {uri} has no {' or '.join(missing)} signature: it is not a "
                "gptpipe model (docs/design.md, SavedModel signatures)"
            )
        yield model


# ---- generate -------------------------------------------------------------------------------


def check_sampling(max_new_tokens: int, temperature: float, seed: int | None = None) -> None:
    """Refuse what the generate signature would misread (a NaN temperature samples garbage)
    or refuse with a traceback (a seed outside the int64 it takes)."""
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise UserError(f"--seed {seed}: pass a whole number that fits in 64 bits")
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens}: pass 1 or more")
    if not (math.isfinite(temperature) and temperature > 0):
        raise UserError(
            f"--temperature {temperature}: pass a number above 0 (lower is more conservative; "
            f"{DEFAULT_TEMPERATURE} by default)"
        )


def generate(
    model: Any,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    seed: int | None,
    stop_at_eos: bool = True,
) -> str:
    """The loaded model's continuation of `prompt` (the continuation only), as text: the
    signature and inputs `generate_call` picks, run in-process."""
    import tensorflow as tf

    available = {
        name: set(model.signatures[name].structured_input_signature[1])
        for name in GENERATE_SIGNATURES
        if name in model.signatures
    }
    name, inputs = generate_call(available, prompt, max_new_tokens, temperature, seed, stop_at_eos)
    feeds = {key: tf.constant(value, GENERATE_DTYPES[key]) for key, value in inputs.items()}
    completion = model.signatures[name](**feeds)["completion"].numpy()[0]
    # Sampled byte-fallback pieces need not form whole UTF-8 characters.
    return bytes(completion).decode("utf-8", errors="replace")


def generate_remote(
    client: RestModel,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    seed: int | None,
    stop_at_eos: bool = True,
) -> str:
    """The served model's continuation of `prompt`: the signature and inputs `generate_call`
    picks, sent in TF Serving's columnar form (the scalars need it)."""
    signatures = client.signatures()
    available = {
        name: set(signatures[name].inputs) for name in GENERATE_SIGNATURES if name in signatures
    }
    name, inputs = generate_call(
        available, prompt, max_new_tokens, temperature, seed, stop_at_eos, client.model_url
    )
    completion = client.predict(name, inputs)["completion"][0]
    # The server wrote the text as JSON; binary output (`{"b64"}`) is decoded as generate does.
    return completion if isinstance(completion, str) else completion.decode("utf-8", "replace")


def generate_call(
    available: Mapping[str, Collection[str]],
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    seed: int | None,
    stop_at_eos: bool = True,
    where: str = "the model",
) -> tuple[str, dict[str, Any]]:
    """Which generate signature to run and its inputs, as JSON values (the prompt a batch of
    one), given the signatures the model has and their inputs (`available`).

    With `stop_at_eos` a continuation ends at the document's end (EOS), if the model samples
    one first; without, it continues through EOS. A model exported before `stop_at_eos`
    existed has no such input and always continues.

    With `seed`, `generate_seeded` samples statelessly from it (the same seed, the same text);
    without, `generate` samples from the model's own random state, which a freshly loaded
    model starts where the export left it. A model exported before `generate_seeded` existed
    cannot take a seed, which a warning says.
    """
    if "generate" not in available:
        raise UserError(
            f"{where} has no generate signature: it is not a gptpipe model (docs/design.md, "
            "SavedModel signatures)"
        )
    name = "generate"
    inputs: dict[str, Any] = {
        "prompt": [prompt],
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
    }
    if seed is not None and "generate_seeded" in available:
        name = "generate_seeded"
        inputs["seed"] = seed
    elif seed is not None:
        print(
            "gptpipe: warning: this model has no generate_seeded signature (exported before "
            "it existed), so --seed has no effect",
            file=sys.stderr,
        )
    if "stop_at_eos" in available[name]:
        inputs["stop_at_eos"] = stop_at_eos
    return name, inputs


# ---- score ----------------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """A text file's content as strict UTF-8; unreadable, non-UTF-8 or empty is a UserError."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}; pass a text file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(
            f"{path} is not UTF-8: byte 0x{data[err.start]:02x} at offset {err.start} "
            f"(line {line}); convert it to UTF-8 (for example `iconv -f latin1 -t utf-8`)"
        ) from None
    if not text.strip():
        raise UserError(f"{path} has no text to score: pass a file with some text in it")
    return text


def score(scorer: ScoreBatch, text: str, source: Path | str) -> Scores:
    """Score `text` as evaluate scores the eval split: line-aligned chunks through `scorer`
    (the `score` signature, in-process or served)."""
    from components.evaluate import scoring

    try:
        return scoring.score_text(scorer, text)
    except UserError:  # raised only when no token was predicted: a one-token text
        raise UserError(
            f"{source} is too short to score: the model predicts no token of it; pass more text"
        ) from None


def remote_scorer(client: RestModel) -> ScoreBatch:
    """The served model's `score` signature as evaluate's ScoreBatch."""
    from components.evaluate.scoring import outputs_scorer

    if "score" not in client.signatures():
        raise UserError(
            f"{client.model_url} has no score signature: it is not a gptpipe model "
            "(docs/design.md, SavedModel signatures)"
        )
    return outputs_scorer(lambda batch: client.predict("score", {"text": batch}))


def _json_number(value: Any) -> Any:
    """A value for JSON, which has no NaN or infinity: a non-finite float as its string."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _first_line(err: BaseException) -> str:
    """An error's message on one line, without TensorFlow's `{{function_node ...}}` prefix."""
    text = str(getattr(err, "message", "") or err).strip()
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1].strip()
    return text.splitlines()[0] if text else type(err).__name__

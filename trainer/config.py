"""Model and training configuration: frozen dataclasses, presets, YAML files, key=value overrides.

Resolution order: dataclass defaults, then a preset (trainer/presets.py) or a YAML file, then
`key=value` overrides. This module must not import TensorFlow: pipeline components
import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.errors import UserError
from trainer import presets
from trainer.presets import PRESET_NAMES

PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
JIT_COMPILE = ("auto", "on", "off")
POSITIONS = ("learned", "rotary")  # model.position's choices
# Fields added after configs were first recorded (lineage, saved runs, --param config=...),
# with the value a config written before them meant. config_to_dict leaves them out at that
# value and config_from_dict fills them in, so an earlier run's config loads and hashes as it
# did when it was recorded, and a config without the new features still loads in an image
# built before them (whose config_from_dict refuses keys it does not know: gptpipe reproduce).
ADDED_FIELDS: dict[str, Any] = {
    "model.position": "learned",
    "train.global_batch_tokens": 0,
    "train.train_tokens": 0,
    "train.warmup_tokens": 0,
    "train.lr_scaling": "linear",
    "train.recompute": "none",
    "train.max_minutes": 0.0,
}
LR_SCALINGS = ("capped", "linear", "none")  # train.lr_scaling's rules (run_plan.peak_learning_rate)
RECOMPUTE = ("none", "blocks")  # train.recompute's modes
# Fields that say the same thing two ways: a layer of the config (a preset, a YAML file, the
# overrides) that sets one to a non-zero value and leaves the other alone clears the other.
EITHER = (("train_steps", "train_tokens"), ("warmup_steps", "warmup_tokens"))
DEFAULT_PRESET = "tiny"  # tests and the local demo; what every entry point defaults to
# How an error message asks for a value of each field type.
_A_VALUE = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


class ConfigError(UserError):
    """A bad configuration: unknown key, wrong type or inconsistent values."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder-only GPT."""

    vocab_size: int = 512  # tokens in the SentencePiece vocabulary (256 byte-fallback pieces incl.)
    seq_len: int = 64  # context window in tokens; longer windows are refused (model.py)
    n_layer: int = 3  # transformer blocks
    n_head: int = 4  # attention heads per block; must divide d_model
    d_model: int = 128  # width of the residual stream
    d_ff: int = 512  # hidden width of each block's MLP
    dropout: float = 0.0  # dropout rate on embeddings, attention weights and residual branches
    # how the model knows positions: learned (GPT-2's table of seq_len vectors added to the
    # embeddings) | rotary (RoPE: queries and keys rotated by position; no table)
    position: str = "learned"
    layer_norm_epsilon: float = 1e-5  # epsilon of every LayerNormalization
    init_std: float = 0.02  # stddev of the normal weight initializer (GPT-2 uses 0.02)


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer, schedule and loop settings."""

    # sequences per replica per forward and backward pass: the micro-batch, the largest that fits
    # a device's memory. The global batch is this x replicas, or train.global_batch_tokens.
    batch_size: int = 32
    # tokens per optimizer step across all replicas; 0: batch_size x replicas x seq_len. When
    # set, each replica accumulates the gradients of global_batch_tokens / (seq_len x replicas x
    # batch_size) micro-batches per step (trainer/run_plan.py)
    global_batch_tokens: int = 0
    train_steps: int = 500  # optimizer steps in total; 0: train_tokens / tokens per step
    train_tokens: int = 0  # tokens to train on in total; 0: train_steps x tokens per step
    # a wall-clock budget for the training loop in minutes; 0: none. When set, the steps (and
    # with them the warmup and decay) come from the step time measured in the first steps
    max_minutes: float = 0.0
    learning_rate: float = 2e-3  # peak learning rate at reference_batch_size
    reference_batch_size: int = 32  # global batch (sequences) at which learning_rate applies
    # how the peak learning rate follows the global batch: capped (linear scaling below
    # reference_batch_size, never above learning_rate) | linear (the seeds' rule, unbounded) |
    # none (learning_rate whatever the batch)
    lr_scaling: str = "capped"
    warmup_steps: int = 50  # linear warmup steps from ~0 to the peak learning rate
    warmup_tokens: int = 0  # the warmup in tokens instead (0: warmup_steps)
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of the peak learning rate
    weight_decay: float = 0.1  # AdamW decoupled weight decay (not on biases and LayerNorm)
    beta_1: float = 0.9  # AdamW first-moment decay
    beta_2: float = 0.99  # AdamW second-moment decay
    grad_clip_norm: float = 1.0  # clip gradients to this global norm; 0 turns clipping off
    seed: int = 1337  # seed for weights, dropout and data shuffling
    checkpoint_every: int = 100  # steps between checkpoints (and validation runs)
    log_every: int = 25  # steps between log lines
    # steps between the workers' check for a SIGTERM (one scalar all-reduce and a host sync):
    # a preempted job backs up at the next multiple, well within the pod's grace period
    preemption_check_every: int = 10
    eval_batches: int = 8  # batches of the eval split per validation run
    shuffle_buffer: int = 2048  # windows permuted together in training (data.TrainOrder)
    precision: str = "auto"  # auto | float32 | mixed_float16 | mixed_bfloat16
    # XLA for train/eval steps: auto (see use_jit_compile) | on | off; off also keeps the
    # XLA-fused GELU out of training (use_xla_kernels)
    jit_compile: str = "auto"
    # activation recomputation: none | blocks (each transformer block's activations are
    # recomputed in the backward pass instead of kept: less memory for about a third more compute)
    recompute: str = "none"


@dataclass(frozen=True)
class Config:
    """The whole resolved configuration of one training run."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)  # network shape
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # optimization settings


def _preset(name: str) -> dict[str, dict[str, Any]]:
    """Return the section overrides that define preset `name` on top of the defaults."""
    found = presets.preset(name)
    if found is None:
        raise ConfigError(
            f"config: unknown preset {name!r}; use one of {PRESET_NAMES} or a .yaml/.yml file"
        )
    return found


def _sections() -> dict[str, type]:
    return {"model": ModelConfig, "train": TrainConfig}


def valid_keys() -> list[str]:
    """All `section.field` keys an override may name."""
    return [f"{s}.{f.name}" for s, cls in _sections().items() for f in dataclasses.fields(cls)]


def _field_type(section: str, name: str) -> type:
    types = {"int": int, "float": float, "bool": bool, "str": str}
    field = {f.name: f for f in dataclasses.fields(_sections()[section])}[name]
    return types[field.type] if isinstance(field.type, str) else field.type


def _resolve_key(key: str) -> tuple[str, str]:
    """Map `section.field` or a unique bare `field` to (section, field)."""
    keys = valid_keys()
    if key in keys:
        section, name = key.split(".", 1)
        return section, name
    matches = [k for k in keys if k.split(".", 1)[1] == key]
    if len(matches) == 1:
        section, name = matches[0].split(".", 1)
        return section, name
    section = key.split(".", 1)[0] if "." in key else ""
    if section and section not in _sections():
        raise ConfigError(
            f"config: unknown section {section!r} in key {key!r}; keys are "
            f"{' or '.join(f'{s}.FIELD' for s in _sections())}, e.g. train.train_steps=1000"
        )
    raise _unknown_key(key, "config: ")


def _unknown_key(key: str, where: str) -> ConfigError:
    """The error for a key no section has: the nearest valid one, then every valid one."""
    keys = valid_keys()
    close = difflib.get_close_matches(key, keys + [k.split(".", 1)[1] for k in keys], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{where}unknown key {key!r}{hint}; valid keys: {', '.join(keys)}")


def _parse_str(key: str, text: str, kind: type) -> Any:
    """Parse an override's text into the field's type."""
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes"):
                return True
            if lowered in ("false", "0", "no"):
                return False
            raise ValueError(text)
        if kind is int and "e" in text.lower():  # 30e9 tokens: an integer in float notation
            value = float(text)
            if not value.is_integer():
                raise ValueError(text)
            return int(value)
        return kind(text)
    except (ValueError, OverflowError):
        raise ConfigError(
            f"config: {key}={text!r} is not a valid {kind.__name__}; give {_A_VALUE[kind]}"
        ) from None


def _check_type(key: str, value: Any, kind: type, source: str) -> Any:
    """Accept `value` from YAML/JSON if it has the field's type (ints are valid floats) and,
    for a float, is finite (YAML's .nan and .inf are floats). An int may be written in float
    notation (`train_tokens: 30e9`, which YAML reads as a string) if it is whole."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, str) and "e" in value.lower():
        value = _parse_str(key, value, int)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(
            f"config: {source}: {key} must be {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config: {source}: {key} must be a finite number, got {value}")
    return value


def _apply(cfg: Config, section: str, values: Mapping[str, Any]) -> Config:
    """Return cfg with `values` (field -> typed value) replaced in `section`."""
    return dataclasses.replace(
        cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)}
    )


def _apply_nested(cfg: Config, data: Mapping[str, Any], source: str) -> Config:
    """Apply a {section: {field: value}} mapping, strictly typed."""
    for section, values in data.items():
        if section not in _sections():
            raise ConfigError(
                f"config: {source}: unknown section {section!r}; use 'model' and 'train' mappings"
            )
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"config: {source}: section {section!r} must be a mapping of field: value, "
                f"got {type(values).__name__} {values!r}"
            )
        typed = {}
        for name, value in values.items():
            key = f"{section}.{name}"
            if key not in valid_keys():
                raise _unknown_key(key, f"config: {source}: ")
            typed[name] = _check_type(key, value, _field_type(section, name), source)
        cfg = _apply(cfg, section, _with_either(section, typed, source))
    return cfg


def _with_either(section: str, values: dict[str, Any], source: str) -> dict[str, Any]:
    """`values` of one layer, with the other field of each EITHER pair cleared where the layer
    sets one of them (non-zero) and not the other; both set is refused."""
    if section != "train":
        return values
    out = dict(values)
    for one, other in EITHER:
        given = [name for name in (one, other) if values.get(name)]
        if len(given) == 2:
            raise ConfigError(
                f"config: {source}: train.{one} and train.{other} both set; give one of them "
                f"(the other is derived from it)"
            )
        if given:
            out.setdefault(other if given[0] == one else one, 0)
    return out


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml  # only needed for YAML configs

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"config: file {path!r} not found; give an existing YAML file") from None
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "it is not UTF-8 text"
        raise ConfigError(f"config: cannot read {path!r}: {why}; give a YAML file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config: {path!r} is not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path!r} must hold a mapping with 'model' and 'train' sections")
    return data


def _yaml_problem(err: Exception) -> str:
    """A YAML parser error in one line: what is wrong and where (PyYAML's spans several)."""
    problem = getattr(err, "problem", None) or str(err)
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}; fix the file".split())


def resolve_config(name: str = DEFAULT_PRESET, overrides: Sequence[str] = ()) -> Config:
    """Build a validated Config from a preset name or YAML file, then `key=value` overrides.

    A YAML file holds `model:`/`train:` mappings and may name a preset to start from with
    `base: <preset>`.
    """
    cfg = Config()
    if name.endswith((".yaml", ".yml")):
        data = _load_yaml(name)
        cfg = _apply_nested(cfg, _preset(str(data.pop("base", DEFAULT_PRESET))), "preset")
        cfg = _apply_nested(cfg, data, name)
    else:
        cfg = _apply_nested(cfg, _preset(name), f"preset {name}")
    given: dict[str, dict[str, Any]] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"config: override {item!r} must look like KEY=VALUE, e.g. train.train_steps=1000"
            )
        section, field = _resolve_key(key.strip())
        given.setdefault(section, {})[field] = _parse_str(
            key, text.strip(), _field_type(section, field)
        )
    for section, values in given.items():
        cfg = _apply(cfg, section, _with_either(section, values, "overrides"))
    validate(cfg)
    return cfg


def _model_errors(m: ModelConfig) -> list[str]:
    errors = [
        f"model.{name} must be positive, got {getattr(m, name)}"
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "d_ff")
        if getattr(m, name) <= 0
    ]
    if m.n_head > 0 and m.d_model % m.n_head:
        errors.append(
            f"model.n_head={m.n_head} must divide model.d_model={m.d_model}; change either"
        )
    if not 0.0 <= m.dropout < 1.0:
        errors.append(f"model.dropout must be in [0, 1), got {m.dropout}")
    if m.position not in POSITIONS:
        errors.append(f"model.position must be one of {POSITIONS}, got {m.position!r}")
    elif m.position == "rotary" and m.n_head > 0 and (m.d_model // m.n_head) % 2:
        errors.append(
            f"model.position=rotary rotates pairs of a head's dimensions, so "
            f"model.d_model / model.n_head must be even, got {m.d_model // max(m.n_head, 1)}"
        )
    if m.layer_norm_epsilon <= 0 or m.init_std <= 0:
        errors.append("model.layer_norm_epsilon and model.init_std must be positive")
    return errors


def _train_errors(t: TrainConfig) -> list[str]:
    positive = (
        "batch_size",
        "reference_batch_size",
        "checkpoint_every",
        "log_every",
        "preemption_check_every",
        "eval_batches",
        "shuffle_buffer",
    )
    errors = [
        f"train.{n} must be positive, got {getattr(t, n)}" for n in positive if getattr(t, n) <= 0
    ]
    if t.learning_rate <= 0:
        errors.append(f"train.learning_rate must be positive, got {t.learning_rate}")
    errors += _length_errors(t)
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        errors.append(f"train.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}")
    if t.weight_decay < 0 or t.grad_clip_norm < 0:
        errors.append("train.weight_decay and train.grad_clip_norm must be >= 0")
    for name in ("beta_1", "beta_2"):
        if not 0.0 <= getattr(t, name) < 1.0:
            errors.append(f"train.{name} must be in [0, 1), got {getattr(t, name)}")
    if not 0 <= t.seed < 2**32:  # numpy's seed range (keras.utils.set_random_seed seeds it)
        errors.append(f"train.seed must be in [0, 2**32 - 1], got {t.seed}")
    if t.precision not in PRECISIONS:
        errors.append(f"train.precision must be one of {PRECISIONS}, got {t.precision!r}")
    if t.jit_compile not in JIT_COMPILE:
        errors.append(f"train.jit_compile must be one of {JIT_COMPILE}, got {t.jit_compile!r}")
    if t.lr_scaling not in LR_SCALINGS:
        errors.append(f"train.lr_scaling must be one of {LR_SCALINGS}, got {t.lr_scaling!r}")
    if t.recompute not in RECOMPUTE:
        errors.append(f"train.recompute must be one of {RECOMPUTE}, got {t.recompute!r}")
    return errors


def _length_errors(t: TrainConfig) -> list[str]:
    """How long the run is and how it warms up: steps or tokens (EITHER), never both."""
    errors = [
        f"train.{name} must be >= 0, got {getattr(t, name)}"
        for name in (
            "train_steps",
            "train_tokens",
            "warmup_steps",
            "warmup_tokens",
            "global_batch_tokens",
            "max_minutes",
        )
        if getattr(t, name) < 0
    ]
    for one, other in EITHER:
        if getattr(t, one) > 0 and getattr(t, other) > 0:
            errors.append(
                f"train.{one} and train.{other} both set; give one of them (the other is "
                "derived from it)"
            )
    if t.train_steps == 0 and t.train_tokens == 0 and t.max_minutes == 0:
        errors.append(
            "the run has no length: set train.train_steps, train.train_tokens or train.max_minutes"
        )
    if t.train_steps > 0 and t.warmup_steps > t.train_steps:
        errors.append(
            f"train.warmup_steps={t.warmup_steps} must be in [0, train.train_steps="
            f"{t.train_steps}]; lower warmup_steps or raise train_steps"
        )
    return errors


def _finite_errors(cfg: Config) -> list[str]:
    """NaN and infinity pass every range check above ("nan > 0" is False), so name them here."""
    return [
        f"{section}.{name} must be a finite number, got {value}"
        for section, values in config_to_dict(cfg).items()
        for name, value in values.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]


def validate(cfg: Config) -> None:
    """Raise ConfigError listing every inconsistent value (one line each)."""
    errors = _finite_errors(cfg) + _model_errors(cfg.model) + _train_errors(cfg.train)
    if errors:
        raise ConfigError("config: " + "; ".join(errors))


def config_to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config as plain JSON-able nested dicts, without the ADDED_FIELDS that hold the
    value configs had before them."""
    data = dataclasses.asdict(cfg)
    for section, name, before in _added_fields():
        if data[section][name] == before:
            del data[section][name]
    return data


def _added_fields() -> list[tuple[str, str, Any]]:
    """ADDED_FIELDS as (section, field, the value configs had before it)."""
    return [(*key.split(".", 1), before) for key, before in ADDED_FIELDS.items()]


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuild a Config from config_to_dict output; every field must be present and typed,
    but those of ADDED_FIELDS, which a config recorded before them lacks.

    A KFP pipeline parameter of type dict travels as a protobuf Struct, whose numbers are all
    doubles, so an integral float (512.0) is accepted for an int field; 512.5 is still refused.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: expected a mapping of sections, got {type(data).__name__}")
    missing = [
        k
        for k in valid_keys()
        if k not in ADDED_FIELDS and k.split(".")[1] not in data.get(k.split(".")[0], {})
    ]
    if missing:
        raise ConfigError(f"config: missing keys {', '.join(missing)}; pass a complete config")
    added: dict[str, dict[str, Any]] = {}
    for section, name, before in _added_fields():
        added.setdefault(section, {})[name] = before
    cfg = _apply_nested(Config(), added, "config's earlier fields")
    cfg = _apply_nested(cfg, _ints_from_struct(data), "config dict")
    validate(cfg)
    return cfg


def _ints_from_struct(data: Mapping[str, Any]) -> dict[str, Any]:
    """Turn integral floats back into ints for int fields (protobuf Struct has only doubles)."""
    out: dict[str, Any] = {}
    for section, values in data.items():
        if section not in _sections() or not isinstance(values, Mapping):
            out[section] = values  # _apply_nested names the problem
            continue
        kinds = {
            f.name: _field_type(section, f.name) for f in dataclasses.fields(_sections()[section])
        }
        out[section] = {
            name: int(v)
            if kinds.get(name) is int and isinstance(v, float) and v.is_integer()
            else v
            for name, v in values.items()
        }
    return out


def config_hash(cfg: Config) -> str:
    """sha256 (hex) of the canonical JSON of the config (config_to_dict's)."""
    canonical = json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def precision_policy(
    precision: str,
    device_kind: str,
    compute_capability: tuple[int, int] | None = None,
    cpu_bf16: bool = False,
) -> str:
    """Keras mixed-precision policy name for `precision` on `device_kind` ("cpu", "gpu", "tpu").

    "auto" picks bfloat16 where the hardware multiplies bfloat16 natively: TPUs, Ampere+ GPUs
    (compute capability >= 8.0) and CPUs with bfloat16 dot-product instructions (`cpu_bf16`:
    AVX512-BF16 or AMX, where oneDNN runs bfloat16 matmuls at about twice float32's rate);
    float16 on Volta/Turing GPUs (>= 7.0); float32 elsewhere.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"config: train.precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    kind = device_kind.lower()
    if kind == "tpu":
        return "mixed_bfloat16"
    if kind == "cpu" and cpu_bf16:
        return "mixed_bfloat16"
    if kind == "gpu" and compute_capability is not None:
        if compute_capability >= (8, 0):
            return "mixed_bfloat16"
        if compute_capability >= (7, 0):
            return "mixed_float16"
    return "float32"


def _check_jit_compile(setting: str) -> None:
    if setting not in JIT_COMPILE:
        raise ConfigError(
            f"config: train.jit_compile must be one of {JIT_COMPILE}, got {setting!r}"
        )


def use_jit_compile(setting: str, device_kind: str, workers: int, replicas: int = 1) -> bool:
    """Whether Keras compiles the train and eval steps with XLA (`jit_compile`).

    "auto" turns XLA on only for one replica on one GPU or TPU: on CPU it measured no faster,
    and under MultiWorkerMirroredStrategy the compiled step holds the cross-worker all-reduce,
    which XLA cannot compile on CPU (UnimplementedError, then the process aborts) and which is
    unmeasured on GPU (docs/training.md); MirroredStrategy over several local devices failed to
    compile on logical CPU devices and is unmeasured on GPUs, so it stays off there too. "on"
    with several CPU workers is refused; other "on"/"off" settings are obeyed.
    """
    _check_jit_compile(setting)
    kind = device_kind.lower()
    if setting == "on" and workers > 1 and kind == "cpu":
        raise ConfigError(
            f"config: train.jit_compile=on cannot run on {workers} CPU workers: XLA does not "
            "compile cross-worker collectives on CPU; use train.jit_compile=auto or off"
        )
    if setting != "auto":
        return setting == "on"
    return workers <= 1 and replicas <= 1 and kind in ("gpu", "tpu")


def use_xla_kernels(setting: str) -> bool:
    """Whether training runs GELU as one XLA-fused kernel (trainer.model.xla_gelu).

    Yes unless XLA is turned off (train.jit_compile=off): on CPU the fused GELU is faster while
    XLA over the whole step is not. It holds no collective, so a strategy runs it as any other
    op (tested on one CPU worker and under MultiWorkerMirrored on CPU); when the whole step is
    compiled (use_jit_compile) it is one more function inside that cluster.
    """
    _check_jit_compile(setting)
    return setting != "off"

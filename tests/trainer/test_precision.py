"""Mixed precision and XLA choices of the trainer: the pure rules, and what compile does."""

from pathlib import Path
from typing import Any

import pytest
import tf_keras as keras

from tests.tiny import TINY_OVERRIDES
from trainer.config import (
    ConfigError,
    precision_policy,
    resolve_config,
    use_jit_compile,
    use_xla_kernels,
)
from trainer.model import build_gpt
from trainer.optimization import build_optimizer
from trainer.run_plan import plan_run
from trainer.task import train


@pytest.fixture
def policy_reset():
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize(
    ("precision", "device", "capability", "expected"),
    [
        ("auto", "cpu", None, "float32"),
        ("auto", "gpu", (9, 0), "mixed_bfloat16"),  # Hopper
        ("auto", "gpu", (8, 0), "mixed_bfloat16"),  # Ampere
        ("auto", "gpu", (7, 0), "mixed_float16"),  # Volta: no bfloat16 tensor cores
        ("auto", "gpu", (6, 1), "float32"),
        ("auto", "tpu", None, "mixed_bfloat16"),
        ("mixed_float16", "cpu", None, "mixed_float16"),  # an explicit choice is obeyed
    ],
)
def test_precision_policy(precision, device, capability, expected):
    assert precision_policy(precision, device, capability) == expected


def test_auto_picks_bfloat16_on_a_cpu_that_multiplies_it_natively():
    assert precision_policy("auto", "cpu", None, cpu_bf16=True) == "mixed_bfloat16"
    assert precision_policy("float32", "cpu", None, cpu_bf16=True) == "float32"  # obeyed
    assert precision_policy("auto", "gpu", (7, 0), cpu_bf16=True) == "mixed_float16"  # GPU's


# Flags lines as Linux prints them (arch/x86/kernel/cpu/proc.c: "flags\t\t: " then the names).
ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
ICELAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
SAPPHIRE = "flags\t\t: avx512f amx_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16\n"  # aarch64 names it "Features": not read


@pytest.mark.parametrize(
    ("cpuinfo", "expected"), [(ZEN4, True), (SAPPHIRE, True), (ICELAKE, False), (ARM, False)]
)
def test_cpu_bf16_is_read_from_cpuinfo_flags(cpuinfo, expected):
    from trainer.precision import cpu_has_bf16

    assert cpu_has_bf16(cpuinfo) is expected


@pytest.mark.parametrize(
    ("setting", "device", "workers", "expected"),
    [
        ("auto", "gpu", 1, True),
        ("auto", "tpu", 1, True),
        ("auto", "cpu", 1, False),
        ("auto", "gpu", 2, False),  # MultiWorkerMirrored: the all-reduce stays outside XLA
        ("auto", "cpu", 2, False),
        ("on", "cpu", 1, True),
        ("on", "gpu", 2, True),
        ("off", "gpu", 1, False),
    ],
)
def test_use_jit_compile(setting, device, workers, expected):
    assert use_jit_compile(setting, device, workers) is expected


def test_auto_xla_stays_off_for_several_local_replicas():
    assert use_jit_compile("auto", "gpu", 1, replicas=1) is True
    assert use_jit_compile("auto", "gpu", 1, replicas=4) is False


def test_jit_compile_on_several_cpu_workers_is_refused():
    with pytest.raises(ConfigError, match="jit_compile=on cannot run on 2 CPU workers"):
        use_jit_compile("on", "cpu", 2)
    with pytest.raises(ConfigError, match="jit_compile must be one of"):
        resolve_config("tiny", ["train.jit_compile=true"])


def test_xla_gelu_unless_xla_is_off():
    assert use_xla_kernels("auto") and use_xla_kernels("on")
    assert not use_xla_kernels("off")
    with pytest.raises(ConfigError, match="jit_compile must be one of"):
        use_xla_kernels("true")


@pytest.mark.parametrize(("policy", "scaled"), [("mixed_float16", True), ("mixed_bfloat16", False)])
def test_loss_scaling_only_for_float16(policy, scaled, policy_reset):
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    keras.mixed_precision.set_global_policy(policy)
    optimizer, _ = build_optimizer(cfg, plan_run(cfg, 1), policy)
    gpt = build_gpt(cfg.model)
    gpt.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    is_scaled = isinstance(gpt.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert is_scaled is scaled
    if scaled:
        assert gpt.optimizer.dynamic and gpt.optimizer.inner_optimizer is not None


@pytest.mark.slow
def test_mixed_bfloat16_trains_on_cpu(tmp_path, examples, policy_reset):
    overrides = ("train.train_steps=10", "train.checkpoint_every=10", "precision=mixed_bfloat16")
    cfg = resolve_config("tiny", TINY_OVERRIDES + overrides)
    metrics = train(str(examples), str(tmp_path / "model"), str(tmp_path / "work"), cfg)
    assert metrics.steps == 10 and not metrics.diverged
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").exists()
    # Served in float32 whatever it trained in: every variable, and the score it gives.
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    saved = tmp_path / "model" / "Format-Serving"
    graph = _saved_model(saved)
    nodes = [
        node
        for meta in graph.meta_graphs
        for function in meta.graph_def.library.function
        for node in function.node_def
    ]
    node_types = {attr.type for node in nodes for attr in node.attr.values()}
    assert nodes and tf.bfloat16.as_datatype_enum not in node_types  # no bfloat16 op is served
    # It trained with the XLA-fused GELU (the default); serving needs no XLA.
    assert not _xla_compiled_functions(graph)
    served = tf.saved_model.load(str(saved))
    scored = served.signatures["score"](text=tf.constant(["To be, or not to be."]))
    assert scored["nats"].dtype == tf.float32 and float(scored["nats_per_char"][0]) > 0


def _saved_model(saved_model_dir: Path) -> Any:
    """The SavedModel proto of `saved_model_dir`."""
    from tensorflow.core.protobuf import saved_model_pb2

    return saved_model_pb2.SavedModel.FromString((saved_model_dir / "saved_model.pb").read_bytes())


def _xla_compiled_functions(graph: Any) -> list[str]:
    """The functions in a SavedModel proto that only run compiled by XLA (`_XlaMustCompile`)."""
    return [
        function.signature.name
        for meta in graph.meta_graphs
        for function in meta.graph_def.library.function
        if function.attr["_XlaMustCompile"].b
    ]


@pytest.mark.slow
@pytest.mark.heavy  # about 20 s: with CI's heavy tier, to keep `make test` under 15 min
def test_trainer_trains_through_xla_gelu_unless_xla_is_off(
    tmp_path, examples, policy_reset, monkeypatch
):
    """`auto` (here: no whole-step XLA) and `on` (the whole step compiled, as `auto` on one
    GPU) trace the GELU of every block as model.xla_gelu; `off` traces none. Same seed, same
    data: the same losses. Trained in float32, whose export once was the trained model itself:
    no export holds an XLA-only function."""
    from trainer import model

    traced = []

    def counting_xla_gelu(x):
        traced.append(x.shape)
        return fused(x)

    fused = model.xla_gelu
    monkeypatch.setattr(model, "xla_gelu", counting_xla_gelu)
    losses, traces = {}, {}
    for setting in ("auto", "on", "off"):
        overrides = (
            "train.train_steps=10",
            "train.checkpoint_every=10",
            "precision=float32",
            f"train.jit_compile={setting}",
        )
        cfg = resolve_config("tiny", TINY_OVERRIDES + overrides)
        out = tmp_path / setting
        traced.clear()
        metrics = train(str(examples), str(out / "model"), str(out / "work"), cfg)
        assert metrics.steps == 10 and not metrics.diverged
        losses[setting], traces[setting] = metrics.final_loss, len(traced)
        assert not _xla_compiled_functions(_saved_model(out / "model" / "Format-Serving"))
    n_layer = resolve_config("tiny", TINY_OVERRIDES).model.n_layer
    assert traces["auto"] >= n_layer and traces["on"] >= n_layer and traces["off"] == 0
    assert losses["on"] == pytest.approx(losses["off"], abs=1e-3)
    assert losses["auto"] == pytest.approx(losses["off"], abs=1e-3)


@pytest.mark.parametrize(
    ("others_lacking", "expected"), [(0.0, "mixed_bfloat16"), (1.0, "float32")]
)
def test_cpu_bfloat16_needs_every_worker_to_have_it(
    monkeypatch, policy_reset, others_lacking, expected
):
    from trainer import precision

    monkeypatch.setattr(precision, "device_kind", lambda: ("cpu", None))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda cpuinfo=None: True)
    flags = []

    def agree(flag: float) -> float:  # the all-reduce: this worker's flag plus the others'
        flags.append(flag)
        return flag + others_lacking

    cfg = resolve_config("tiny", TINY_OVERRIDES)
    policy, jit = precision.set_precision_and_choose_xla(cfg, 2, 2, agree)
    assert (policy, jit, flags) == (expected, False, [0.0])
    assert keras.mixed_precision.global_policy().name == expected


@pytest.mark.parametrize(("native", "warned"), [(False, True), (True, False)])
def test_bfloat16_asked_for_on_a_cpu_that_emulates_it_is_warned_about(
    monkeypatch, policy_reset, caplog, native, warned
):
    from trainer import precision

    monkeypatch.setattr(precision, "device_kind", lambda: ("cpu", None))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda cpuinfo=None: native)
    cfg = resolve_config("tiny", (*TINY_OVERRIDES, "train.precision=mixed_bfloat16"))
    with caplog.at_level("WARNING", logger="trainer"):
        policy, _ = precision.set_precision_and_choose_xla(cfg, 1, 1)
    assert policy == "mixed_bfloat16"  # obeyed, and said
    assert (precision.EMULATED_BF16 in caplog.text) is warned

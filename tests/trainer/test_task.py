"""trainer.task and the modules it runs: schedule, cluster helpers, CLI errors, and tiny
end-to-end training runs."""

import itertools
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contracts import records, termination
from contracts.artifacts import BACKUP_DIR, CHECKED_SHARDS_DIR
from contracts.errors import UserError
from contracts.training import TrainMetrics
from tests.processes import free_ports
from tests.tiny import TINY_OVERRIDES, read_eval_documents
from trainer import data, export, shard_check
from trainer.callbacks import TrainMonitor
from trainer.cluster import choose_strategy, cluster_size, is_chief
from trainer.config import config_from_dict, config_to_dict, resolve_config
from trainer.faults import Fault, InjectFault
from trainer.model import build_gpt
from trainer.optimization import FusedAdamW, WarmupCosine
from trainer.preemption import backed_up_step
from trainer.run_plan import learning_rate_at, plan_run
from trainer.task import _export_barrier, compiled_model, main, parse_args, train

REPO = Path(__file__).resolve().parents[2]
METRIC_KEYS = {
    "steps",
    "final_loss",
    "diverged",
    "diverged_at_step",
    "tokens_per_second",
    "global_batch_size",
    "replicas",
    "workers",
    "precision_policy",
}


def test_schedule_matches_learning_rate_at():
    schedule = WarmupCosine(3e-3, 10, 100, 0.1)
    for step in (0, 5, 9, 10, 50, 99, 150):
        assert float(schedule(step)) == pytest.approx(
            learning_rate_at(step, 3e-3, 10, 100, 0.1), rel=1e-5
        )


def test_fused_adamw_updates_as_keras_adamw_does():
    """FusedAdamW against tf-keras' AdamW over 6 steps of a schedule, from the same variables and
    gradients: decayed kernels, an undecayed bias, a clipped global norm, and a sparse gradient
    (which takes AdamW's own path). The variables and the slots (m, v: what checkpoints hold)
    match after every step, in a plain tf.function and in one compiled by XLA; each dense
    update is the one fused kernel. An epsilon near sqrt(v) so that where it goes shows."""

    def setup(cls):
        variables = [
            tf.Variable(tf.random.stateless_normal(shape, (i, 1)), name=name)
            for i, (name, shape) in enumerate(
                [("kernel", (8, 6)), ("bias", (6,)), ("embeddings", (10, 4))]
            )
        ]
        optimizer = cls(
            learning_rate=WarmupCosine(0.05, 2, 6, 0.1),
            weight_decay=0.1,
            beta_1=0.9,
            beta_2=0.99,
            epsilon=0.1,
            global_clipnorm=1.0,
            jit_compile=False,  # tf-keras' default on a GPU host is XLA per update
        )
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        optimizer.build(variables)
        return variables, optimizer

    def gradients(step):
        kernel, bias = (
            tf.random.stateless_normal(s, (step, 7 + i)) for i, s in enumerate([(8, 6), (6,)])
        )
        rows = tf.constant([step % 10, 3, 3])  # a repeated row, as a gather's gradient has them
        sparse = tf.IndexedSlices(
            tf.random.stateless_normal((3, 4), (step, 9)), rows, tf.constant([10, 4])
        )
        return [kernel * 2.0, bias, sparse]  # the norm is over 1: the clip scales them all

    def applier(variables, optimizer, jit_compile=False):
        return tf.function(
            lambda g: optimizer.apply_gradients(zip(g, variables, strict=True)),
            jit_compile=jit_compile,
        )

    plain, plain_opt = setup(keras.optimizers.AdamW)
    fused, fused_opt = setup(FusedAdamW)
    compiled, compiled_opt = setup(FusedAdamW)
    runs = [
        (plain, plain_opt, applier(plain, plain_opt)),
        (fused, fused_opt, applier(fused, fused_opt)),
        (compiled, compiled_opt, applier(compiled, compiled_opt, jit_compile=True)),
    ]
    for step in range(6):
        for _, _, apply in runs:
            apply(gradients(step))
        for variables, optimizer, _ in runs[1:]:
            for a, b in zip(
                variables + optimizer.variables, plain + plain_opt.variables, strict=True
            ):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(fused[2].numpy(), tf.random.stateless_normal((10, 4), (2, 1)).numpy())
    ops = runs[1][2].get_concrete_function(gradients(0)).graph.get_operations()
    assert [op.type for op in ops].count("ResourceApplyAdam") == 2  # the kernel and the bias


def test_cluster_helpers_and_default_strategy():
    two_workers = json.dumps(
        {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    )
    assert cluster_size(two_workers) == 2 and not is_chief(two_workers)
    assert is_chief(json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}))
    with_chief = json.dumps(
        {"cluster": {"chief": ["c:0"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    )
    assert cluster_size(with_chief) == 2 and not is_chief(with_chief)
    assert is_chief(None) and cluster_size(None) == 0
    assert choose_strategy(None) is tf.distribute.get_strategy()


def _config_json(**changes):
    """The JSON of the tiny test config, with `section.field` values changed (or removed: None)."""
    sections = config_to_dict(resolve_config("tiny", TINY_OVERRIDES))
    for key, value in changes.items():
        section, name = key.split("__")
        if value is None:
            del sections[section][name]
        else:
            sections[section][name] = value
    return json.dumps(sections)


def test_cli_user_errors_exit_2(tmp_path, examples, capsys):
    dirs = ["--model-dir", str(tmp_path / "m"), "--work-dir", str(tmp_path / "w")]
    good = ["--config-json", _config_json()]
    assert main(["--examples", str(tmp_path / "nope"), *dirs, *good]) == 2
    assert "examples" in capsys.readouterr().err
    cases = [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"model": 5, "train": {}}), "must be a JSON object"),
        (_config_json(model__n_layerz=2), "unknown key 'model.n_layerz'"),
        (_config_json(model__n_head=3), "n_head=3 must divide"),
        (_config_json(train__seed=None), "missing keys train.seed"),
        (_config_json(train__train_steps="many"), "train.train_steps must be int"),
    ]
    for text, message in cases:
        assert main(["--examples", str(examples), *dirs, "--config-json", text]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --config-json: ") and message in err, err
        assert "Traceback" not in err and err.count("\n") == 1, err
    mismatch = _config_json(model__vocab_size=999)
    assert main(["--examples", str(examples), *dirs, "--config-json", mismatch]) == 2
    err = capsys.readouterr().err
    assert "manifest vocab_size=320 but model.vocab_size=999" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_a_user_error_is_written_to_the_termination_message_file(tmp_path, capsys, monkeypatch):
    """The launcher's file (GPTPIPE_TERMINATION_MESSAGE) gets the input-error record; stderr
    still has the one line for people. No variable: no file, the same exit."""
    dirs = ["--model-dir", str(tmp_path / "m"), "--work-dir", str(tmp_path / "w")]
    argv = ["--examples", str(tmp_path / "nope"), *dirs, "--config-json", _config_json()]
    path = tmp_path / "worker-0.termination-log"
    monkeypatch.setenv(termination.WORKER_MESSAGE_ENV, str(path))
    assert main(argv) == termination.INPUT_ERROR_EXIT
    said = termination.read(str(path))
    err = capsys.readouterr().err
    assert said is not None and said.kind == termination.INPUT_ERROR
    assert said.message.startswith("examples: folder ") and err == f"error: {said.message}\n"
    monkeypatch.setenv(termination.WORKER_MESSAGE_ENV, str(tmp_path / "no" / "such" / "dir"))
    assert main(argv) == 2  # a file it cannot write is said, and changes nothing else
    assert "could not write the termination message" in capsys.readouterr().err


def test_cli_takes_the_resolved_config_only(tmp_path, capsys):
    dirs = ["--model-dir", str(tmp_path / "m"), "--work-dir", str(tmp_path / "w")]
    with pytest.raises(SystemExit) as exited:
        main(["--examples", str(tmp_path), *dirs])
    assert exited.value.code == 2 and "--config-json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # the trainer resolves no preset or override
        main(["--examples", str(tmp_path), *dirs, "--config-json", _config_json(), "--set", "x=1"])
    assert exited.value.code == 2 and "unrecognized arguments: --set" in capsys.readouterr().err


def test_seq_len_must_match_manifest(tmp_path, examples):
    cfg = resolve_config("tiny", TINY_OVERRIDES + ("model.seq_len=32",))
    with pytest.raises(UserError, match="manifest seq_len=16 but model.seq_len=32"):
        train(str(examples), str(tmp_path / "m"), str(tmp_path / "w"), cfg)


def _keras_eval_loss(examples, model_dir, work_dir, cfg):
    """Restore the last checkpoint into a fresh model; mean loss over the eval split windows."""
    gpt = build_gpt(cfg.model)
    latest = tf.train.latest_checkpoint(str(work_dir / "checkpoints"))
    tf.train.Checkpoint(model=gpt).restore(latest).expect_partial()
    manifest = data.read_manifest(str(examples))
    ds = data.make_dataset(data.split_files(str(examples), manifest, "eval"), cfg.model.seq_len, 1)
    losses = [
        tf.keras.losses.sparse_categorical_crossentropy(y, gpt(x), from_logits=True) for x, y in ds
    ]
    return float(np.mean(losses))


@pytest.mark.slow
def test_train_end_to_end_exports_a_working_model(tmp_path, examples):
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    model_dir, work_dir = tmp_path / "model", tmp_path / "work"
    metrics = train(str(examples), str(model_dir), str(work_dir), cfg)

    saved = json.loads((model_dir / "train_metrics.json").read_text())
    assert records.from_dict(TrainMetrics, saved, "saved") == metrics and set(saved) == METRIC_KEYS
    assert saved["steps"] == cfg.train.train_steps and saved["diverged"] is False
    assert saved["diverged_at_step"] is None
    assert saved["final_loss"] < math.log(cfg.model.vocab_size) - 1.5  # it learned
    assert saved["tokens_per_second"] > 0
    assert (saved["global_batch_size"], saved["replicas"], saved["workers"]) == (8, 1, 1)
    assert config_from_dict(json.loads((model_dir / "config.json").read_text())) == cfg
    assert tf.train.latest_checkpoint(str(work_dir / "checkpoints")).endswith("ckpt-40")
    assert list((work_dir / "logs").iterdir())
    assert not list(tmp_path.glob(".model.tmp-*"))

    loaded = tf.saved_model.load(str(model_dir / "Format-Serving"))
    out = loaded.signatures["generate"](
        prompt=tf.constant(["ROMEO:\n", ""]),
        max_new_tokens=tf.constant(12),
        temperature=tf.constant(0.0),
        stop_at_eos=tf.constant(False),
    )["completion"].numpy()
    assert all(len(c.decode("utf-8")) > 0 for c in out)
    eval_text = "".join(read_eval_documents(examples))
    scored = loaded.signatures["score"](text=tf.constant([eval_text]))
    nats_per_token = float(scored["nats_per_token"][0])
    keras_loss = _keras_eval_loss(examples, model_dir, work_dir, cfg)
    assert nats_per_token == pytest.approx(keras_loss, rel=0.03)
    assert int(scored["chars"][0]) == len(eval_text)


@pytest.mark.slow
def test_divergence_is_recorded_not_raised(tmp_path, examples):
    cfg = resolve_config("tiny", TINY_OVERRIDES + ("learning_rate=1e9", "grad_clip_norm=0"))
    model_dir = tmp_path / "model"
    metrics = train(str(examples), str(model_dir), str(tmp_path / "work"), cfg)
    saved = json.loads((model_dir / "train_metrics.json").read_text())
    assert saved["diverged"] is True
    assert 1 <= saved["diverged_at_step"] < cfg.train.train_steps
    assert saved["steps"] == saved["diverged_at_step"] == metrics.diverged_at_step
    assert (model_dir / "Format-Serving" / "saved_model.pb").exists()


@pytest.mark.slow
def test_restarted_job_resumes_from_backup(tmp_path, examples, monkeypatch):
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    args = (str(examples), str(tmp_path / "model"), str(tmp_path / "work"), cfg)
    steps_run = []
    original = TrainMonitor.on_train_batch_end

    def on_batch_end(self, batch, logs=None):
        steps_run.append(int(self.model.optimizer.iterations.numpy()))
        if crash and steps_run[-1] == 25:
            raise RuntimeError("worker preempted")
        original(self, batch, logs)

    monkeypatch.setattr(TrainMonitor, "on_train_batch_end", on_batch_end)
    crash = True
    with pytest.raises(RuntimeError, match="preempted"):
        train(*args)
    assert not (tmp_path / "model").exists()
    backup = tmp_path / "work" / BACKUP_DIR
    assert backed_up_step(str(backup)) == 20  # what the restarted input will skip
    assert backed_up_step(str(tmp_path / "no-backup")) == 0
    checked = tmp_path / "work" / CHECKED_SHARDS_DIR
    assert sorted(p.name for p in checked.iterdir()) == ["eval-0-of-1.json", "train-0-of-1.json"]
    crash, steps_run[:] = False, []
    shards_read = []
    whole = shard_check._shard_problem
    monkeypatch.setattr(
        shard_check, "_shard_problem", lambda path, n: shards_read.append(path) or whole(path, n)
    )
    assert train(*args).steps == cfg.train.train_steps
    assert steps_run[0] == 21  # resumed after the backup taken at step 20, not from scratch
    assert shards_read == []  # the shards the first attempt checked were not read again


def _checkpoint(work_dir, step):
    """The numbers in the periodic checkpoint at `step`: weights, optimizer slots, step; not
    the count of the attempt's saves."""
    reader = tf.train.load_checkpoint(str(work_dir / "checkpoints" / f"ckpt-{step}"))
    dtypes = reader.get_variable_to_dtype_map()  # a string: the object graph
    names = [n for n, t in dtypes.items() if t != tf.string and not n.startswith("save_counter")]
    return {name: reader.get_tensor(name) for name in names}


@pytest.mark.slow
def test_a_run_accumulating_gradients_resumes_at_an_optimizer_step(tmp_path, examples, monkeypatch):
    """A step is all its micro-batches, so a backup is never taken mid-accumulation: a run
    that crashes after step 15 and resumes from its backup at step 10 ends where an
    uninterrupted one does."""
    overrides = ("train_steps=20", "checkpoint_every=10", "batch_size=4")
    cfg = resolve_config("tiny", TINY_OVERRIDES + overrides + ("global_batch_tokens=128",))
    assert plan_run(cfg, 1).accumulation == 2
    whole = train(str(examples), str(tmp_path / "m1"), str(tmp_path / "w1"), cfg)
    original = TrainMonitor.on_train_batch_end

    def crash_after_step_15(self, batch, logs=None):
        if crash and int(self.model.optimizer.iterations.numpy()) == 15:
            raise RuntimeError("worker preempted")
        original(self, batch, logs)

    monkeypatch.setattr(TrainMonitor, "on_train_batch_end", crash_after_step_15)
    args = (str(examples), str(tmp_path / "m2"), str(tmp_path / "w2"), cfg)
    crash = True
    with pytest.raises(RuntimeError, match="preempted"):
        train(*args)
    assert backed_up_step(str(tmp_path / "w2" / BACKUP_DIR)) == 10
    crash = False
    resumed = train(*args)
    assert resumed.final_loss == pytest.approx(whole.final_loss, rel=1e-6)
    expected, found = _checkpoint(tmp_path / "w1", 20), _checkpoint(tmp_path / "w2", 20)
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(found[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


class _OneWorkerTwoReplicas:
    """The part of tf.distribute.MirroredStrategy over 2 devices that distributed_datasets uses:
    it calls the dataset function once for the worker's one input pipeline with 2 replicas in
    sync (distribute_lib.py: `distribute_datasets_from_function`), and a step then takes one
    batch per replica from it. Real MirroredStrategy needs its devices before TF starts."""

    num_replicas_in_sync = 2

    def distribute_datasets_from_function(self, dataset_fn):
        return dataset_fn(tf.distribute.InputContext(1, 0, 2))


@pytest.mark.slow
@pytest.mark.parametrize(("replicas", "accumulation"), [(1, 1), (2, 1), (2, 2)])
def test_resumed_input_skips_the_batches_trained_before(examples, replicas, accumulation):
    """distributed_datasets(skip_steps=K) starts at the batch an uninterrupted run's step K+1
    reads, with one batch per replica per step (all its micro-batches): the same data in the
    same order (the seed fixes it), not the first batch again."""
    tokens = replicas * accumulation * 8 * 16  # replicas x micro-batches x batch_size x seq_len
    cfg = resolve_config("tiny", TINY_OVERRIDES + (f"train.global_batch_tokens={tokens}",))
    assert plan_run(cfg, replicas).accumulation == accumulation
    manifest = data.read_manifest(str(examples))
    strategy = tf.distribute.get_strategy() if replicas == 1 else _OneWorkerTwoReplicas()

    def first_batches(skip_steps: int, n: int) -> list[np.ndarray]:
        plan = plan_run(cfg, replicas)
        found = data.distributed_datasets(strategy, str(examples), manifest, cfg, plan, skip_steps)
        return [x.numpy() for x, _ in itertools.islice(iter(found.train), n)]

    uninterrupted = first_batches(0, 8 * replicas)
    resumed = first_batches(5, 3 * replicas)
    for a, b in zip(resumed, uninterrupted[5 * replicas :], strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(resumed[0], uninterrupted[0])
    assert resumed[0].shape == (accumulation * 8, 16)  # a replica's whole step


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["none", "blocks"])
def test_compiled_model_recomputes_blocks_in_training_only_when_configured(setting):
    """train.recompute=blocks reaches the blocks of the model fit trains, which trains through
    them with the trainer's own step; the model the export writes never recomputes."""
    cfg = resolve_config("tiny", TINY_OVERRIDES + (f"train.recompute={setting}",))
    plan = plan_run(cfg, 1)
    built = compiled_model(tf.distribute.get_strategy(), cfg, plan, "float32", jit=False)
    blocks = [layer for layer in built.gpt.layers if layer.name.startswith("h_")]
    assert blocks and all(b.recompute is (setting == "blocks") for b in blocks)
    ids = np.arange(2 * cfg.model.seq_len, dtype=np.int32).reshape(2, -1) % cfg.model.vocab_size
    before = [w.numpy() for w in built.gpt.trainable_weights]
    loss = built.trainee.train_on_batch(ids, np.roll(ids, -1, axis=1))
    assert np.isfinite(loss)
    assert all(  # every weight trained: none went without a gradient
        not np.array_equal(b, w.numpy())
        for b, w in zip(before, built.gpt.trainable_weights, strict=True)
    )
    serving = export.serving_model(built.gpt, cfg)
    assert not any(layer.get_config().get("recompute") for layer in serving.layers)


@pytest.mark.slow
def test_multi_worker_training_with_real_worker_processes(tmp_path, examples):
    workers = [f"localhost:{p}" for p in free_ports(2)]
    flags = ["--examples", str(examples), "--model-dir", str(tmp_path / "model")]
    flags += ["--work-dir", str(tmp_path / "work")]
    cfg = resolve_config("tiny", TINY_OVERRIDES + ("train_steps=20", "checkpoint_every=10"))
    flags += ["--config-json", json.dumps(config_to_dict(cfg))]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "2"}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "trainer.task", *flags],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = [p.communicate(timeout=240)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    metrics = json.loads((tmp_path / "model" / "train_metrics.json").read_text())
    assert (metrics["workers"], metrics["replicas"], metrics["global_batch_size"]) == (2, 2, 16)
    assert metrics["steps"] == 20 and metrics["final_loss"] < math.log(320)
    assert not [p.name for p in (tmp_path / "work").iterdir() if "scratch" in p.name]
    checkpoints = tmp_path / "work" / "checkpoints"
    assert (checkpoints / "ckpt-20.index").exists()
    assert not [p.name for p in checkpoints.iterdir() if "worker-tmp" in p.name]


@pytest.mark.slow
def test_a_failed_export_keeps_the_backup_and_the_restart_only_exports(
    tmp_path, examples, monkeypatch
):
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    args = (str(examples), str(tmp_path / "model"), str(tmp_path / "work"), cfg)
    original = export.write_model_dir

    def unavailable(*a, **k):
        raise tf.errors.UnavailableError(None, None, "storage is briefly unavailable")

    monkeypatch.setattr(export, "write_model_dir", unavailable)
    with pytest.raises(export.ExportFailed, match="briefly unavailable"):
        train(*args)
    assert (tmp_path / "work" / "backup").is_dir() and not (tmp_path / "model").exists()

    monkeypatch.setattr(export, "write_model_dir", original)
    steps_run = []
    monkeypatch.setattr(
        TrainMonitor, "on_train_batch_end", lambda self, batch, logs=None: steps_run.append(batch)
    )
    metrics = train(*args)
    assert metrics.steps == cfg.train.train_steps
    assert steps_run == []  # nothing was trained again: the backup was at the last step
    # The metrics are those of the attempt that trained, not this one's NaN loss and 0 tokens/s.
    assert math.isfinite(metrics.final_loss) and metrics.tokens_per_second > 0
    written = json.loads((tmp_path / "model" / "train_metrics.json").read_text())
    assert written["final_loss"] == metrics.final_loss
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").is_file()
    assert (tmp_path / "work" / "backup").is_dir()  # the train step removes it, not a worker


def test_a_fault_at_the_export_fires_only_in_a_run_that_trained_from_step_0(monkeypatch):
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(sig))
    flags = ["--examples", "e", "--model-dir", "m", "--work-dir", "w", "--config-json", "{}"]
    args = parse_args(
        [*flags, "--fault-at-export", "--fault-worker", "0", "--fault-signal", "TERM"]
    )
    assert args.fault_at_export and args.fault_at_step == 0
    fault = InjectFault(Fault(0, 0, "TERM", at_export=True), task_index=0)
    fault.after_export()  # a run resumed at its last step trains no batch: not from step 0
    assert sent == []
    fault._checked = True  # its first batch was step 1
    fault.after_export()
    assert sent == [signal.SIGTERM]
    other = InjectFault(Fault(0, 0, "TERM", at_export=True), task_index=1)
    other._checked = True
    other.after_export()
    assert sent == [signal.SIGTERM]  # only the worker named


def test_the_export_barrier_turns_a_lost_peer_into_a_failed_export():
    def lost_peer(flag):
        raise tf.errors.UnavailableError(None, None, "task 0 is gone")

    with pytest.raises(export.ExportFailed, match="task 0 is gone"):
        _export_barrier(lost_peer)
    _export_barrier(lambda flag: 0.0)  # everyone arrived


def test_the_preemption_check_runs_every_k_steps_counted_from_step_0():
    """Workers must all-reduce their SIGTERM flags at the same steps, resumed or not."""
    from trainer.preemption import PreemptibleBackup, PreemptionWatch

    backup = PreemptibleBackup("/unused", 100, PreemptionWatch(), float, check_every=4)
    backup.initial_step = 6  # resumed from a backup at step 6: checks after 8, 12 and 16
    assert [step for step in range(7, 17) if backup.check_due()] == [8, 12, 16]

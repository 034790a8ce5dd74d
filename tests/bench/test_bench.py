"""The benchmark suite's own logic: the peer's parameter count, the table, tiers, the pure
helpers of each benchmark, and bench/gpu.sh's skip on a machine without a GPU. Nothing here is
timed."""

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as runner
from bench import (
    gpu_bench,
    orchestration_bench,
    peer_env,
    peer_gpt2,
    proc_memory,
    quality_bench,
    quality_tune,
    recompute_bench,
    serve_bench,
    workloads,
)
from bench.results import (
    Figure,
    Target,
    cpu_model,
    format_value,
    markdown_table,
    memory_gib,
    report,
)
from contracts.artifacts import EVAL_TEXT
from tests.tiny import write_eval_text
from trainer import flops

REPO = Path(__file__).resolve().parents[2]


# ---- FLOPs --------------------------------------------------------------------------------


def test_param_count_at_issue_13s_shape_matches_kerashub_gpt2():
    # KerasHub's GPT2Backbone + tied head at 4L d512 T256 V2048 reports 13,790,208 parameters
    # (peer_gpt2's `params`): both models have the same parameters, so the same FLOPs.
    from trainer.config import resolve_config

    m = resolve_config("tiny", workloads.peer_shape(512)).model
    assert flops.matmul_params(m) + m.seq_len * m.d_model == 13_790_208


# ---- figures and the table ----------------------------------------------------------------


def test_targets_say_whether_a_value_meets_them():
    assert Target(">=", 1.15).met(1.2) is True
    assert Target(">=", 1.15).met(1.0) is False
    assert Target("<=", 0.1).met(0.1) is True
    assert Target("<=", 0.1).met(0.2) is False
    assert Target(">=", 1.0).met(None) is None


def test_values_are_shown_in_their_unit():
    assert format_value(1.234, "x") == "1.23x"
    assert format_value(0.756, "%") == "75.6%"
    assert format_value(1234.5, "tok/s") == "1,234 tok/s"
    assert format_value(None, "x") == "n/a"


def test_the_table_shows_every_figure_a_miss_and_a_figure_not_measured():
    figures = [
        Figure("speed vs peer", 1.02, target=Target(">=", 1.15)),
        Figure("headroom", 12.0, target=Target(">=", 10.0)),
        Figure("overhead", 0.31, unit="%", target=Target("<=", 0.1)),
        Figure("plain", 2.0),
        Figure("gpu", None, note="skipped: no GPU", target=Target(">=", 0.45), unit="%"),
    ]
    lines = markdown_table(figures).splitlines()
    assert lines[0] == "| figure | value | target | met? |"
    assert lines[2] == "| speed vs peer | 1.02x | >= 1.15x | **no** |"
    assert lines[3] == "| headroom | 12.00x | >= 10.00x | yes |"
    assert lines[4] == "| overhead | 31.0% | <= 10.0% | **no** |"
    assert lines[5] == "| plain | 2.00x | - | - |"
    assert lines[6] == "| gpu | n/a (skipped: no GPU) | >= 45.0% | **no** (not measured) |"


def test_machine_facts_are_parsed_from_proc():
    assert cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: avx\n") == (
        "AMD EPYC 7B13"
    )
    assert cpu_model("") == ""
    assert memory_gib("MemTotal:       24641532 kB\nMemFree: 1 kB\n") == 23.5
    assert memory_gib("") is None


def test_the_report_records_inputs_machine_versions_and_is_json():
    figure = Figure("x", 1.5, target=Target(">=", 1.0), inputs={"threads": 2}, bench="peer_bench")
    doc = json.loads(json.dumps(report([figure], "quick", [], 12.3)))
    assert {"date", "tier", "machine", "versions", "figures"} <= set(doc)
    assert doc["machine"]["cores"] >= 1
    assert "tensorflow" in doc["versions"] and "python" in doc["versions"]
    (row,) = doc["figures"]
    assert row["met"] is True and row["inputs"] == {"threads": 2} and row["shown"] == "1.50x"


# ---- tiers --------------------------------------------------------------------------------


def test_tiers_quick_full_and_gpu_only_when_named():
    names = runner.discover()
    tiers = {n: importlib.import_module(f"bench.{n}").TIER for n in names}
    quick = runner.select(names, tiers, [], full=False)
    full = runner.select(names, tiers, [], full=True)
    assert "peer_bench" in quick and "quality_bench" not in quick and "gpu_bench" not in quick
    assert "quality_bench" in full and "gpu_bench" not in full
    assert runner.select(names, tiers, ["gpu"], full=False) == ["gpu_bench"]
    assert runner.select(names, tiers, ["storage"], full=False) == ["storage_bench"]
    assert names.index("peer_bench") < names.index("mfu_bench") < names.index("storage_bench")


def test_a_failing_module_becomes_a_row_that_says_so():
    (row,) = runner.run_module("no_such_bench", full=False)
    assert row.value is None and row.failed and "ModuleNotFoundError" in row.note
    assert row.bench == "no_such_bench" and "failed" in markdown_table([row])


# ---- pure helpers of the benchmarks -------------------------------------------------------


def test_orchestration_counts_overlapping_steps_once():
    assert orchestration_bench.covered_seconds([(0, 2), (1, 3), (5, 6)]) == 4
    assert orchestration_bench.covered_seconds([(0, 5), (1, 2)]) == 5
    assert orchestration_bench.overhead(10.0, [(0, 2), (3, 9)]) == pytest.approx(0.2)
    summary = {
        "steps": {
            "train": {"properties": {"start_time_ms": 2000, "end_time_ms": 5000}},
            "cached": {"properties": {}},
        }
    }
    assert orchestration_bench.step_spans(summary) == {"train": (2.0, 5.0)}


def test_bigram_floor():
    text = "ab" * 200
    assert quality_bench.bigram_nats_per_char(text, "abab", alpha=1e-6) < 1e-3
    # overwhelming smoothing is the uniform model over the alphabet
    uniform = quality_bench.bigram_nats_per_char("abc", "cab", alpha=1e9)
    assert uniform == pytest.approx(math.log(3))


def test_planned_steps_fit_the_budget_and_fall_on_the_curves_points():
    # 10 steps/s, 20 s of start-up, 600 s: at most 0.9 * 580 * 10 = 5220 steps
    assert quality_bench.planned_steps(100_000, 10.0, 20.0, 600.0) == 5220
    assert quality_bench.planned_steps(100_000, 3.0, 20.0, 600.0) == 1564  # 1566, on the points
    assert quality_bench.planned_steps(1000, 10.0, 20.0, 600.0) == 1000  # the recipe's fit
    assert quality_bench.planned_steps(1000, 0.001, 20.0, 600.0) == quality_bench.POINTS


def test_the_quality_split_is_the_corpus_less_its_eval_tail(tmp_path):
    corpus, examples = tmp_path / "corpus.txt", tmp_path / "examples"
    corpus.write_text("First line\nsecond\nthe tail\n", encoding="utf-8")
    write_eval_text(examples / EVAL_TEXT, ["the tail\n"])
    assert quality_bench.train_split(examples, corpus) == ("First line\nsecond\n", "the tail\n")
    write_eval_text(examples / EVAL_TEXT, ["second\n"])
    with pytest.raises(RuntimeError, match="not the corpus's tail"):
        quality_bench.train_split(examples, corpus)


def test_quality_tune_variants_parse_and_resolve():
    from trainer.config import ConfigError, resolve_config

    assert quality_tune.parse_variant("6 layers: model.n_layer=6, model.dropout=0.2") == (
        "6 layers",
        ("model.n_layer=6", "model.dropout=0.2"),
    )
    assert quality_tune.parse_variant("the preset:") == ("the preset", ())
    for bad in ("model.n_layer=6", ":model.n_layer=6"):
        with pytest.raises(Exception, match="label:key=value"):
            quality_tune.parse_variant(bad)
    for _label, overrides in quality_tune.VARIANTS:  # each a valid quality config
        resolve_config(quality_tune.PRESET, list(overrides))
    with pytest.raises(ConfigError):
        resolve_config(quality_tune.PRESET, ["model.n_layers=6"])


@pytest.mark.parametrize("steps_per_s", [0.5, 1.3, 5.0])  # a slow host's, Zen 5's, the cap's
def test_the_trainers_checkpoints_fall_on_the_curves_points(steps_per_s):
    from trainer.config import resolve_config

    steps = quality_bench.planned_steps(900, steps_per_s, startup_s=30.0, budget_s=600.0)
    every = quality_bench.checkpoint_at_points(steps)
    cfg = resolve_config("quality", [f"train.train_steps={steps}", every])
    assert cfg.train.checkpoint_every * quality_bench.POINTS == cfg.train.train_steps


def test_quality_tune_refuses_a_schedule_whose_last_step_has_no_checkpoint(tmp_path):
    # checked before anything is tokenized or trained
    with pytest.raises(SystemExit, match="train_steps=1001 is not a multiple of 4"):
        quality_tune.run_variant("odd", ("train.train_steps=1001",), tmp_path / "none.txt")


def test_quality_tune_table_compares_with_the_first_variant():
    results = [
        {"label": "base", "nats_per_char": 1.5, "curve": [{"step": 900}]},
        {"label": "wider", "nats_per_char": 1.47, "curve": [{"step": 900}]},
    ]
    rows = quality_tune.table(results).splitlines()
    assert rows[2] == "| base | 900 | 1.500 | – |"
    assert rows[3] == "| wider | 900 | 1.470 | -2.0% |"


@pytest.mark.parametrize("length", [1, 2, 8, 9, 10, 17, 25])
def test_peer_scores_every_target_once_as_the_score_signature_does(length):
    ids = list(range(1, length + 1))
    windows = list(peer_gpt2._windows(ids, seq_len=8))
    assert all(len(w) == 9 and len(m) == 9 for w, m in windows)
    targets = [w[i] for w, m in windows for i in range(1, 9) if m[i]]
    assert targets == ids[1:]


def test_peer_plans_its_schedule_again_at_the_end_of_warmup_from_all_its_steps():
    # the quality preset's warmup: planned at step 20, then at 100, where the cosine starts
    assert peer_gpt2.replan_steps(100) == (peer_gpt2.CALIBRATION, 100)
    assert peer_gpt2.replan_steps(5) == (peer_gpt2.CALIBRATION,)  # warmup over by then
    # one slow stretch in steps 2..20 (2 steps/s) plans short; steps 2..100 at 3 steps/s do not
    early = peer_gpt2.planned(20, seconds=9.5, left_s=500.0, safety=0.9, cap=10**6)
    # steps 21..100 took 23.5 s, so 476.5 s are left at step 100
    again = peer_gpt2.planned(100, seconds=33.0, left_s=476.5, safety=0.9, cap=10**6)
    assert (early, again) == (20 + 900, 100 + 1286)
    assert peer_gpt2.planned(100, seconds=33.0, left_s=476.5, safety=0.9, cap=900) == 900
    assert peer_gpt2.planned(100, seconds=33.0, left_s=-5.0, safety=0.9, cap=900) == 100


def test_a_torch_venv_pip_cannot_make_is_one_clear_line_in_the_table(tmp_path, monkeypatch):
    import subprocess as sp

    from bench import torch_env

    def pip(command, **kwargs):
        if "venv" in command:  # `python -m venv`: a folder with an interpreter in it
            (tmp_path / "v" / "bin").mkdir(parents=True)
            return sp.CompletedProcess(command, 0)
        err = "ERROR: No matching distribution found for torch==2.13.0\n"
        return sp.CompletedProcess(command, 1, "", "Looking in indexes: ...\n" + err)

    monkeypatch.setattr(torch_env, "VENV", tmp_path / "v")
    monkeypatch.setattr(peer_env.subprocess, "run", pip)
    with pytest.raises(RuntimeError) as err:
        torch_env.run(["matmul"], 10, threads=2)
    line = str(err.value)
    assert "\n" not in line and "torch==2.13.0" in line and "pip exited 1" in line
    assert "No matching distribution" in line
    monkeypatch.setattr("bench.torch_bench.figures", lambda full: torch_env.run([], 1, 2))
    (row,) = runner.run_module("torch_bench", full=False)
    assert row.failed and row.value is None and "No matching distribution" in row.note


def test_the_torch_peer_must_have_the_trainers_parameters():
    from bench import torch_bench
    from trainer.config import resolve_config

    m = resolve_config("tiny", workloads.peer_shape(512)).model
    torch_bench.check_params(13_790_208, m)  # nanoGPT's count at issue 13's shape
    with pytest.raises(RuntimeError, match="13,790,209 parameters"):
        torch_bench.check_params(13_790_209, m)


def test_onednn_reads_the_cpus_flags():
    from bench import onednn_bench

    info = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 sse\n"
    assert onednn_bench.cpu_flags(info) == ["avx2", "avx512f", "avx512_bf16"]
    assert onednn_bench.cpu_flags("") == []


def test_peer_venv_is_keyed_by_its_pin_set(tmp_path):
    assert peer_env.pins_key(("a==1", "b==2")) == peer_env.pins_key(("b==2", "a==1"))
    assert peer_env.pins_key(("a==1",)) != peer_env.pins_key(("a==2",))
    assert not peer_env._is_current(tmp_path / "missing", peer_env.PINS)


def test_gpu_summary():
    runs = {
        "bf16_xla": {"tokens_per_s": 400.0, "flops_per_token": 10**9},
        "bf16": {"tokens_per_s": 200.0, "flops_per_token": 10**9},
        "fp32": {"tokens_per_s": 100.0, "flops_per_token": 10**9},
        "mirrored": {"tokens_per_s": 360.0, "flops_per_token": 10**9},
        "mirrored_xla": {"tokens_per_s": 720.0, "flops_per_token": 10**9},
        "xl_recompute": {"tokens_per_s": 30.0, "flops_per_token": 2 * 10**10},
        "xl": {"tokens_per_s": 40.0, "flops_per_token": 2 * 10**10},
        "accum4": {"tokens_per_s": 380.0, "flops_per_token": 10**9, "jit_compile": True},
        "bf16_xla_host_syncs": {"error": "not run: out of time"},
    }
    s = gpu_bench.summarize(runs, peak_tflops=1.0, gpus=2)
    assert s["mfu"] == pytest.approx(0.4)
    assert s["mixed_precision_speedup"] == pytest.approx(2.0)
    assert s["xla_speedup"] == pytest.approx(2.0)
    assert s["mirrored_scaling"] == pytest.approx(0.9)
    assert s["mirrored_xla_scaling"] == pytest.approx(0.9)
    assert s["host_syncs_speed_ratio"] is None
    # gpt2-xl's MFU with its own FLOPs per token, not gpt2-small's
    assert s["xl_mfu_recompute"] == pytest.approx(0.6) and s["xl_mfu"] == pytest.approx(0.8)
    assert s["recompute_speed_ratio"] == pytest.approx(0.75)
    assert s["accumulation_speed_ratio"] == pytest.approx(0.95)  # over bf16_xla: both XLA
    without_xla = {**runs, "accum4": {**runs["accum4"], "jit_compile": False}}
    assert gpu_bench.summarize(without_xla, 1.0, 2)["accumulation_speed_ratio"] == 1.9  # / bf16
    one_gpu = gpu_bench.summarize(runs, peak_tflops=None, gpus=1)
    # On one GPU: MirroredStrategy's overhead over the plain bf16 step.
    assert one_gpu["mfu"] is None and one_gpu["mirrored_scaling"] == pytest.approx(1.8)
    assert gpu_bench.summarize(runs, peak_tflops=None, gpus=0)["mirrored_scaling"] is None
    assert "fp32" not in s["mfu_by_run"]  # the bf16 peak is not float32's
    failed = {**runs, "bf16_xla": {"error": "x"}, "bf16": {"error": "x"}}
    assert gpu_bench.summarize(failed, peak_tflops=1.0, gpus=2)["mfu"] is None


def test_gpu_runs_without_xla_where_it_does_not_compile_and_each_run_is_capped(monkeypatch):
    calls = []
    no_ptxas = "No PTX compilation provider is available"

    def child(args, timeout):
        calls.append((args, timeout))
        if args == ["--probe"]:
            return {"gpus": 1, "device": "NVIDIA H200", "xla_error": no_ptxas}
        return {"tokens_per_s": 100.0, "flops_per_token": 10**9}

    monkeypatch.setattr(gpu_bench, "_child", child)
    out = gpu_bench.run_all("gpt2-small", 8, allow_cpu=False)
    errors = {name: run["error"] for name, run in out["runs"].items() if "error" in run}
    assert set(errors) == {"bf16_xla", "mirrored_xla", "bf16_xla_host_syncs"}
    assert all(no_ptxas in e for e in errors.values())
    ran = {args[1]: (args, timeout) for args, timeout in calls[1:]}
    # mirrored too, on one GPU; gpt2-xl's and accumulation's without XLA
    assert set(ran) == {"bf16", "fp32", "mirrored", "xl_recompute", "xl", "accum4"}
    assert all("--no-xla-kernels" in args for args, _ in ran.values())
    assert all(timeout <= gpu_bench.RUN_CAP_S for _, timeout in ran.values())
    assert out["mfu"] == pytest.approx(100.0 * 10**9 / 989e12)


def test_gpu_runs_plan_their_batch_as_the_trainer_does():
    from trainer import run_plan
    from trainer.config import resolve_config

    def plan(name, replicas=1, jit=True):
        run = gpu_bench.RUNS[name]
        shape = gpu_bench.LARGE["gpt2-small"] if run.large else "gpt2-small"
        preset, overrides = gpu_bench.run_config(run, shape, 8, replicas, jit, True)
        cfg = resolve_config(preset, overrides)
        return cfg, run_plan.plan_run(cfg, replicas)

    # one micro-batch a step: the presets' global_batch_tokens does not make it 64
    cfg, small = plan("bf16_xla")
    assert (small.micro_batch, small.accumulation, small.global_batch) == (8, 1, 8)
    assert (cfg.model.n_layer, cfg.model.vocab_size, cfg.train.jit_compile) == (12, 50257, "on")
    assert plan("bf16", jit=False)[0].train.jit_compile == "auto"  # the XLA-fused GELU inside
    cfg, accum = plan("accum4", replicas=2)
    assert (accum.micro_batch, accum.accumulation, accum.global_batch) == (8, 4, 64)
    cfg, xl = plan("xl_recompute")
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.seq_len) == (48, 1600, 1024)
    assert cfg.train.recompute == "blocks" and xl.accumulation == 1
    assert plan("xl")[0].train.recompute == "none"
    cfg, mirrored = plan("mirrored_xla", replicas=8)
    assert cfg.train.jit_compile == "on" and mirrored.global_batch == 64


def test_a_gpu_runs_result_is_its_last_json_line_and_a_failure_tells_its_stderr():
    assert gpu_bench.last_json('{"a": 1}\nlog line\n{"tokens_per_s": 5.0}\n') == {
        "tokens_per_s": 5.0
    }
    assert gpu_bench.last_json('{"a": 1}\nSegmentation fault at exit\n') == {"a": 1}
    assert gpu_bench.last_json("Traceback (most recent call last):\n[1, 2]\n") is None
    assert gpu_bench._tail(b"one\ntwo\nthree\nfour\n") == ": two | three | four"
    assert gpu_bench._tail(None) == ""


@pytest.mark.slow
def test_gpu_script_without_a_gpu_prints_that_it_was_skipped_and_exits_0():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["skipped"] is True and out["bench"] == "gpu"
    assert "no GPU" in out["reason"]


def test_quality_uses_the_quality_preset_or_says_it_fell_back_to_tiny():
    from trainer.config import PRESET_NAMES

    name, note = quality_bench.preset()
    if "quality" in PRESET_NAMES:
        assert (name, note) == ("quality", "")
    else:
        assert name == "tiny" and "quality" in note


def test_the_quality_peer_trains_with_the_trainers_recipe():
    """Same shape and same recipe (batch, warmup, dropout, optimizer): only the models' position
    encodings and the implementations differ (the peer once had `tiny`'s: no dropout, half the
    warmup)."""
    import dataclasses

    from trainer.config import resolve_config

    ours, peer = resolve_config(quality_bench.preset()[0]), quality_bench.peer_config()
    assert peer.model == dataclasses.replace(ours.model, position="learned")
    assert peer.train == ours.train


def test_the_peer_refuses_positions_gpt2_does_not_have(monkeypatch):
    from trainer.config import config_to_dict, resolve_config

    for module in ("keras", "keras_hub"):  # importing either would raise ImportError
        monkeypatch.setitem(sys.modules, module, None)
    cfg = config_to_dict(resolve_config("tiny", ["model.position=rotary"]))
    with pytest.raises(SystemExit, match="not model.position=rotary"):
        peer_gpt2.build(cfg, total_steps=10, dropout=None)  # before keras_hub is imported


def test_recompute_compares_fresh_processes_peaks_and_each_sides_best_step(monkeypatch):
    peaks = {"none": 1000, "blocks": 550}
    monkeypatch.setattr(
        recompute_bench,
        "measure_memory",
        lambda setting: {"setting": setting, "policy": "float32", "peak_above_KiB": peaks[setting]},
    )
    steps = {"none": [10.0, 20.0, 10.5], "blocks": [12.0, 40.0, 13.0]}  # round 2 disturbed
    cpu = {"none": [20.0, 20.0, 20.0], "blocks": [25.0, 25.0, 26.0]}
    monkeypatch.setattr(recompute_bench, "measure_time", lambda: {"step_s": steps, "cpu_s": cpu})
    memory, time = recompute_bench.figures(full=False)
    assert memory.value == pytest.approx(550 / 1000) and memory.met
    assert time.value == pytest.approx(12.0 / 10.0) and time.met  # each side's best step
    assert time.details["cpu_ratio"] == pytest.approx(76 / 60)
    assert (memory.target.value, time.target.value) == (0.60, 1.35)


def test_recompute_reads_and_resets_the_peak_rss():
    held = bytearray(64 << 20)  # 64 MiB touched, then dropped: the peak stays above the RSS
    held[::4096] = b"x" * len(held[::4096])
    del held
    assert proc_memory.status_kib("VmHWM") >= proc_memory.status_kib("VmRSS") + 60_000
    proc_memory.reset_peak()
    assert proc_memory.status_kib("VmHWM") < proc_memory.status_kib("VmRSS") + 60_000


def test_alternating_runs_go_a_b_b_a():
    from bench import alternate

    calls = []
    a, b = alternate.abba(
        lambda i: calls.append(("a", i)) or i, lambda i: calls.append(("b", i)) or i, 2
    )
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert (a, b) == ([0, 1], [0, 1])


def test_the_peer_comparison_pins_each_sides_precision():
    from bench import peer_bench, workloads
    from trainer.config import resolve_config
    from trainer.precision import cpu_has_bf16

    f32 = resolve_config("tiny", workloads.peer_overrides(512, 10, "float32"))
    auto = resolve_config("tiny", workloads.peer_overrides(512, 10))
    assert (f32.train.precision, auto.train.precision) == ("float32", "auto")
    assert f32.model == auto.model and f32.model.d_model == 512
    expected = "mixed_bfloat16" if cpu_has_bf16() else "float32"
    assert workloads.auto_policy() == expected
    # What a user gets from each as it comes: the trainer's auto runs over the peer's float32.
    same = Figure("auto", 1.0, details={"trainer_tokens_per_s": [300.0, 320.0]})
    plain = Figure("f32", 1.0, details={"peer_tokens_per_s": [190.0, 200.0]})
    mixed = peer_bench.as_they_come("4L", same, plain, "mixed_bfloat16")
    assert mixed.value == pytest.approx(1.6) and mixed.target is None
    assert "mixed_bfloat16" in mixed.name and "float32" in mixed.name


def test_the_peer_trains_in_the_policy_it_is_given(monkeypatch):
    base = ["peer_gpt2.py", "speed", "--examples", "x", "--config-json", "{}"]
    monkeypatch.setattr(sys, "argv", base)
    assert peer_gpt2.parse_args().policy == "float32"  # Keras' own default
    monkeypatch.setattr(sys, "argv", [*base, "--policy", "mixed_bfloat16"])
    assert peer_gpt2.parse_args().policy == "mixed_bfloat16"


def test_mfu_over_100_is_flagged_and_a_ceiling_over_100_is_shown(monkeypatch):
    # Stand-ins for the timed parts: a reference matmul, the ceilings and the trainer's runs.
    from bench import mfu_bench, trainer_run

    monkeypatch.setattr(mfu_bench, "matmul_reference", lambda **kwargs: 1e11)
    monkeypatch.setattr(mfu_bench, "ceilings", lambda d_models, full: {d: 1.07 for d in d_models})
    monkeypatch.setattr(workloads, "auto_policy", lambda: "float32")
    slow = {"a": [8, 8, 256, 256], "b": [8, 8, 256, 64], "transpose_a": True}
    slowest = {**slow, "transpose_b": False, "of_reference": 0.41, "share_of_matmul_time": 0.05}
    monkeypatch.setattr(mfu_bench, "matmul_rates", lambda d_model, full: [slowest])

    def run(preset, overrides, attempt=0):
        d_model = next(int(o.split("=")[1]) for o in overrides if "d_model" in o)
        if d_model == 256:  # 103%: over a bare matmul, under the step's own matmuls (107%)
            per_token = flops.flops_per_token(trainer_run.config(preset, overrides).model)
            return {"tokens_per_second": 1.03e11 / per_token}
        return {"tokens_per_second": 1e6 if d_model == 128 else 100.0}  # 128: impossibly fast

    monkeypatch.setattr(trainer_run, "run_trainer", run)
    mfu_128, mfu_256, mfu_512, ceiling = mfu_bench.figures(full=False)
    assert mfu_128.name.endswith("d_model 128") and ceiling.name.startswith("MFU ceiling")
    assert mfu_128.value is None and "impossible" in mfu_128.note
    assert mfu_256.value == pytest.approx(1.03)
    assert mfu_512.value is not None and 0 < mfu_512.value < 1 and mfu_512.note.endswith("107.0%")
    assert ceiling.value == pytest.approx(1.07) and "ran faster than the reference" in ceiling.note
    assert ceiling.details["matmul_rates"] == [slowest]
    assert ceiling.note.endswith(
        "slowest matmul (8, 8, 256, 256)T x (8, 8, 256, 64) at 41% of the reference "
        "(5% of the matmul time)"
    )


def test_the_step_matmuls_are_ranked_slowest_first_with_their_share_of_the_time():
    from bench import mfu_bench, trainer_run

    cfg = trainer_run.config("tiny", ())
    matmuls = flops.step_matmuls(cfg.model, cfg.train.batch_size)
    distinct = list(dict.fromkeys(matmuls))
    # Each distinct matmul "ran" at its own rate over a 1e11 FLOP/s reference: 0.1, 0.2, ...
    speed = {mm: (i + 1) / 10 for i, mm in enumerate(distinct)}
    seconds = {mm: mm.flops / (speed[mm] * 1e11) for mm in distinct}
    ranked = mfu_bench.rank_matmuls(matmuls, seconds, 1e11)
    assert len(ranked) == len(distinct) < len(matmuls)  # the layers' repeats counted once
    assert [r["of_reference"] for r in ranked] == pytest.approx(sorted(speed.values()))
    assert sum(r["share_of_matmul_time"] for r in ranked) == pytest.approx(1.0)
    # A matmul the step runs in every layer weighs n_layer times its single run.
    first = ranked[0]  # the slowest: distinct[0], at 0.1
    assert (first["a"], first["b"]) == (distinct[0].a, distinct[0].b)
    total = sum(seconds[mm] for mm in matmuls)
    share = seconds[distinct[0]] * matmuls.count(distinct[0]) / total
    assert first["share_of_matmul_time"] == pytest.approx(share)
    assert matmuls.count(distinct[0]) == cfg.model.n_layer
    assert mfu_bench.describe_matmul(ranked[0]) == (
        f"{distinct[0].a} x {distinct[0].b}" + ("T" if distinct[0].transpose_b else "")
    )


def _tokenize_run(encode_s: float, peak_sum: int, digests: dict | None = None) -> dict:
    """A run of the step as tokenize_bench.run_step reports it."""
    return {
        "stages_s": {"read": 2.0, "encode": encode_s, "write": 0.5},
        "stages_cpu_s": {"read": 2.0, "encode": encode_s * 1.5, "write": 0.5},
        "between_s": 3.0,
        "units": "16 files in 16 units, on 2 parts",
        "peak_step_MB": 200,
        "peak_sum_MB": peak_sum,
        "peak_largest_MB": 200,
        "parts_MB": {"read": [80, 90], "encode": [100, 110]},
        "shards": 40,
        "windows": 5000,
        "digests": digests or {"Split-train/a.gz": "1", "manifest.json": "2"},
    }


def test_tokenize_keeps_each_sides_best_run():
    from bench import tokenize_bench

    # 1 part, bare, 2 parts, 2 parts, bare, 1 part: the last 1-part run and the first
    # reference were the faster.
    large = {
        "MB": 100,
        "runs": {
            1: [_tokenize_run(20.0, 500), _tokenize_run(10.0, 500)],
            2: [_tokenize_run(8.0, 600), _tokenize_run(6.0, 700)],
        },
        "bares": [(8.0, 7.5), (6.0, 9.0)],
        "corpus": {"files": 16, "stored_MB": 25.0},
    }
    summary = tokenize_bench.summarize(large)
    assert summary["encode_MBps"] == pytest.approx(10.0) and summary["bare_MBps"] == 8.0
    assert summary["ratio_vs_bare"] == pytest.approx(10.0 / 8.0)
    assert summary["scaling"] == pytest.approx(10.0 / 6.0)
    details = tokenize_bench.speed_details(summary)
    assert details["bare_cpu_s_per_MB"] == pytest.approx(1 / 9.0)
    assert details["encode_cpu_s_per_MB"] == pytest.approx(15.0 / 100)
    # memory: the highest peak of any run, not the faster one's
    assert tokenize_bench._peaks(large["runs"][2])["peak_sum_MB"] == 700


def test_tokenize_figures_hold_identity_to_zero_differing_files(monkeypatch):
    from bench import tokenize_bench

    same = {"Split-train/a.gz": "1", "manifest.json": "2"}
    other = {"Split-train/a.gz": "9", "manifest.json": "2", "extra": "3"}
    small = {"MB": 10, "runs": {p: [_tokenize_run(1.0, 400, same)] for p in (1, 2, 4)}}
    large = {
        "MB": 100,
        "runs": {1: [_tokenize_run(10.0, 420, same)] * 2, 2: [_tokenize_run(6.0, 430, same)] * 2},
        "bares": [(8.0, 8.0)] * 2,
        "corpus": {"files": 16, "stored_MB": 25.0},
    }
    fake = {"vocab_size": 1, "seq_len": 1, "files": 16, "cores": 2, "sizes_MB": [10, 100]}
    fake |= {
        "load_before": 0.5,
        "load_after": 1.5,
        "small": small,
        "large": tokenize_bench.summarize(large),
    }
    monkeypatch.setattr(tokenize_bench, "main", lambda full: fake)
    rows = tokenize_bench.figures(False)
    (identity,) = [f for f in rows if "differ" in f.name]
    assert identity.value == 0 and identity.met and identity.note == ""
    (growth,) = [f for f in rows if "summed, at" in f.name]
    assert growth.value == pytest.approx(430 / 400) and growth.met
    small["runs"][4] = [_tokenize_run(1.0, 400, other)]
    (identity,) = [f for f in tokenize_bench.figures(False) if "differ" in f.name]
    assert identity.value == 2 and identity.met is False
    assert identity.details["differing"]["10 MB, 4 parts"] == ["Split-train/a.gz", "extra"]


def test_tokenize_tree_digests_name_every_file(tmp_path):
    from bench import tokenize_bench

    (tmp_path / "Split-eval").mkdir()
    (tmp_path / "Split-eval" / "part.gz").write_bytes(b"x")
    (tmp_path / "manifest.json").write_bytes(b"{}")
    digests = tokenize_bench.tree_digests(tmp_path)
    assert set(digests) == {"Split-eval/part.gz", "manifest.json"}
    assert tokenize_bench.differing(digests, dict(digests)) == []


def test_tokenize_documents_keep_their_bounds():
    import random

    from bench import tokenize_bench

    text = "a line\n" * 20_000
    starts = [i for i in range(0, len(text), 7)]
    rng = random.Random(0)
    lengths = [len(tokenize_bench.document(text, starts, rng)) for _ in range(20_000)]
    low, high = tokenize_bench.DOC_BYTES
    assert min(lengths) == low and max(lengths) == high  # both clips are reached
    assert low < sorted(lengths)[10_000] < high


def test_tokenize_1tb_estimate_adds_its_stages():
    from bench import tokenize_bench

    cluster = tokenize_bench.Cluster(
        text_bytes=16e6, pods=16, gcs_MBps=1.0, compression=2.0, unit_bytes=2 * 10**6
    )
    estimate = tokenize_bench.extrapolate(
        cluster, read_MBps=4.0, encode_MBps=1.0, tokenizer_s=5.0, windows_per_MB=4096.0
    )
    assert estimate["phase1_s"] == pytest.approx(1 / 2.0)  # GCS-bound: 1 MB at 2 text MB/s
    assert estimate["phase2_s"] == pytest.approx(1 / 1.0)  # CPU-bound
    assert estimate["units"] == 4  # 8 MB stored
    assert estimate["shards"] == pytest.approx(16 + 2 * 4)
    assert estimate["merge_s"] == pytest.approx(24 * 2 * 0.1 / 8)
    assert estimate["total_s"] == pytest.approx(120 + 0.5 + 5 + 1 + 0.6)


def test_serve_bench_texts_are_whole_lines_of_about_1_kb_and_percentiles_are_ranks():
    text = "".join(f"line {i} " + "x" * (i % 70) + "\n" for i in range(2000))
    texts = serve_bench.one_kb_texts(text, 10)
    assert len(texts) == 10 and "".join(texts) == text[: len("".join(texts))]
    for piece in texts:
        assert piece.endswith("\n") and 1024 <= len(piece.encode()) < 1024 + 80
    values = [float(v) for v in range(1, 101)]
    assert serve_bench.percentile(values, 0.5) == 50.0
    assert serve_bench.percentile(values, 0.99) == 99.0
    assert serve_bench.percentile([3.0], 0.99) == 3.0

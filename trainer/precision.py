"""The numerics of the training step on this host: the mixed-precision policy and XLA.

The rules are pure functions in trainer.config (`precision_policy`, `use_jit_compile`); this
module asks TensorFlow which device it runs on and applies them.
"""

from __future__ import annotations

import functools
import logging

import tensorflow as tf
import tf_keras as keras

from trainer import config as config_lib
from trainer.config import Config
from trainer.preemption import Agreement

log = logging.getLogger("trainer")


def device_kind() -> tuple[str, tuple[int, int] | None]:
    """("gpu", compute capability) for a GPU host, else ("cpu", None)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu", None
    details = tf.config.experimental.get_device_details(gpus[0])
    return "gpu", details.get("compute_capability")


# /proc/cpuinfo flags of x86 CPUs that multiply bfloat16 natively (Cooper Lake, Sapphire Rapids
# and later Xeons: AMX; AMD Zen 4 and later: AVX512-BF16). oneDNN, which TensorFlow's x86 CPU
# kernels use, dispatches bfloat16 MatMul to them.
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Said once when train.precision=mixed_bfloat16 is asked for on a CPU without them (`auto` never
# picks it there): TensorFlow then emulates bfloat16, and its softmax rounds the intermediate
# values (2.8% largest relative error over 256-long rows on an AVX2 EPYC; within one bfloat16
# ulp where the instructions exist: tests/trainer/test_model.py).
EMULATED_BF16 = (
    "train.precision=mixed_bfloat16 on a CPU without bfloat16 instructions (AVX512-BF16, AMX): "
    "TensorFlow emulates it, slower than float32 and with a less exact attention softmax; "
    "train.precision=auto picks float32 here"
)


@functools.cache
def _host_cpuinfo() -> str:
    """/proc/cpuinfo's text, read once per process ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (`cpuinfo`: /proc/cpuinfo's text;
    read from the host when None; False where there is none, as on macOS)."""
    if cpuinfo is None:
        cpuinfo = _host_cpuinfo()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return not CPU_BF16_FLAGS.isdisjoint(value.split())
    return False


def device_name() -> str:
    """What trains on this host, for the record: the first GPU's name (e.g. "NVIDIA H200"),
    else "CPU"."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU"))


def host_policy(precision: str = "auto") -> str:
    """The Keras policy `train.precision=precision` resolves to on this host, alone."""
    kind, capability = device_kind()
    return _policy(precision, kind, capability, lambda flag: flag)


def _policy(precision: str, kind: str, capability: tuple[int, int] | None, agree: Agreement) -> str:
    """bfloat16 on CPU needs every worker's CPU to have it (`agree` sums a flag over them), so
    that a job whose pods land on mixed CPU generations still trains in one policy."""
    lacks_bf16 = not (kind == "cpu" and cpu_has_bf16())
    cpu_bf16 = agree(1.0 if lacks_bf16 else 0.0) == 0.0
    return config_lib.precision_policy(precision, kind, capability, cpu_bf16)


def set_precision_and_choose_xla(
    cfg: Config,
    workers: int,
    replicas: int,
    agree: Agreement = lambda flag: flag,
) -> tuple[str, bool]:
    """The mixed-precision policy, set globally before any layer exists, and whether to use XLA.

    `agree` is trainer.preemption.preemption_agreement; every worker calls this once, at the
    same point.
    """
    kind, capability = device_kind()
    policy = _policy(cfg.train.precision, kind, capability, agree)
    if policy == "mixed_bfloat16" and kind == "cpu" and not cpu_has_bf16():
        log.warning(EMULATED_BF16)
    keras.mixed_precision.set_global_policy(policy)
    jit = config_lib.use_jit_compile(cfg.train.jit_compile, kind, workers, replicas)
    return policy, jit

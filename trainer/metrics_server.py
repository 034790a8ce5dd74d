"""Live training metrics for Prometheus: the chief's `/metrics` endpoint (prometheus-client).

The series (docs/monitoring.md names them all and the alerts worth setting):

    gptpipe_train_step                  optimizer steps taken (global), at the last logging step
    gptpipe_train_total_steps           train.train_steps: where the step is going
    gptpipe_train_loss                  training loss (Keras' running mean since the validation)
    gptpipe_train_val_loss              loss on the eval split, at the last validation
    gptpipe_train_learning_rate         learning rate of the last step
    gptpipe_train_grad_norm             global gradient norm before clipping, last step
    gptpipe_train_tokens_per_second     global tokens/s over the last logging interval
    gptpipe_train_step_seconds          mean step time over the last logging interval
    gptpipe_train_input_wait_fraction   share of that step time spent waiting for input
    gptpipe_train_allreduce_seconds     mean gradient all-reduce time per step (CPU workers)
    gptpipe_train_mfu                   model FLOPs utilisation (known GPUs)
    gptpipe_gpu_utilization_ratio{gpu}  NVML: share of time a kernel ran, per GPU
    gptpipe_gpu_memory_used_bytes{gpu}  NVML: memory used, per GPU
    gptpipe_gpu_power_watts{gpu}        NVML: power draw, per GPU

Training series change at logging steps (every train.log_every steps); GPU series are read from
NVML when Prometheus scrapes. A series that cannot be measured on this host is left out rather
than reported as 0. Each `MetricsServer` has its own registry, so a process may train twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("trainer")

METRICS_PATH = "/metrics"  # where prometheus-client's server answers (it answers any path)

_TRAIN_SERIES = {
    "step": "Optimizer steps taken (global), at the last logging step.",
    "total_steps": "Steps this training runs for (train.train_steps).",
    "loss": "Training loss: Keras' running mean over the steps since the last validation.",
    "val_loss": "Loss on the eval split at the last validation.",
    "learning_rate": "Learning rate of the last step.",
    "grad_norm": "Global gradient norm before clipping, at the last logging step.",
    "tokens_per_second": "Global training tokens per second over the last logging interval.",
    "step_seconds": "Mean wall time of a step over the last logging interval.",
    "input_wait_fraction": "Share of step time spent waiting for the next batch.",
    "allreduce_seconds": "Mean seconds per step in the gradient all-reduce (CPU workers only).",
    "mfu": "Model FLOPs utilisation over the last logging interval (known GPUs only).",
}


class GpuCollector:
    """Per-GPU utilisation, memory used and power from NVML, read at scrape time."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._warned = False

    @classmethod
    def start(cls, nvml: ModuleType | None = None) -> GpuCollector | None:
        """Initialise NVML; None (logged once) when it cannot start, e.g. without a driver."""
        try:
            if nvml is None:
                import pynvml

                nvml = pynvml
            nvml.nvmlInit()
            return cls(nvml)
        except Exception as err:  # NVMLError subclasses, or the library missing altogether
            log.warning("metrics: no GPU metrics, NVML did not start: %s", err)
            return None

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util, memory, power = self._families()
        nvml = self.nvml
        reads = (
            (util, lambda handle: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
            (memory, lambda handle: float(nvml.nvmlDeviceGetMemoryInfo(handle).used)),
            (power, lambda handle: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),  # mW
        )
        for index, handle in enumerate(self.handles):
            for family, read in reads:  # each on its own: a MIG slice has no utilisation
                try:
                    family.add_metric([str(index)], read(handle))
                except Exception as err:  # a GPU that fell off the bus, a query not supported
                    if not self._warned:
                        log.warning("metrics: NVML query of GPU %d failed: %s", index, err)
                        self._warned = True
        yield from (util, memory, power)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already shut down: nothing to release
            self.nvml.nvmlShutdown()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "gptpipe_gpu_utilization_ratio",
                "Share of the last sample period in which a kernel ran on the GPU (NVML).",
                labels=["gpu"],
            ),
            GaugeMetricFamily(
                "gptpipe_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=["gpu"]
            ),
            GaugeMetricFamily("gptpipe_gpu_power_watts", "GPU power draw (NVML).", labels=["gpu"]),
        )


class MetricsServer:
    """The gauges above on `port`, served by prometheus-client's HTTP server in a daemon thread.

    A port that cannot be bound is logged once and training goes on unobserved: metrics must
    never stop a training run.
    """

    def __init__(self, port: int, gpus: bool, nvml: ModuleType | None = None) -> None:
        self.registry = CollectorRegistry()
        self.gauges: dict[str, Gauge] = {}  # made at their first value: none reads 0 unmeasured
        self.gpu = GpuCollector.start(nvml) if gpus else None
        if self.gpu is not None:
            self.registry.register(self.gpu)  # type: ignore[arg-type]
        self._server: Any = None
        try:
            self._server, _ = start_http_server(port, registry=self.registry)
            log.info("metrics: serving Prometheus metrics on port %d at %s", port, METRICS_PATH)
        except OSError as err:
            log.warning("metrics: cannot serve on port %d (%s); training goes on", port, err)

    def set(self, **values: float | None) -> None:
        """Set the training gauges given (None: not measured, left as it was)."""
        for name, value in values.items():
            if value is None:
                continue
            if name not in self.gauges:
                self.gauges[name] = Gauge(
                    f"gptpipe_train_{name}", _TRAIN_SERIES[name], registry=self.registry
                )
            self.gauges[name].set(value)

    def close(self) -> None:
        """Stop serving and release NVML."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.gpu is not None:
            self.gpu.close()

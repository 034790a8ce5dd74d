"""The GPUs a run can be planned for: memory, compute capability, and how clusters name them.

Pure data and matching (no TensorFlow), for `gptpipe plan` and the train step's check before it
submits a TFJob (trainer/capacity.py). Names follow trainer/flops.py's PEAK_FLOPS where a chip
has one memory size (H200, H100, L40S, L4, T4); where it has two the size is part of the name
(A100-80GB, V100-16GB).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from contracts.errors import UserError

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    """One GPU model as a plan needs it."""

    name: str  # as `gptpipe plan --gpu` takes it (any case)
    memory_bytes: int  # device memory a process can see: nvidia-smi's memory.total
    capability: tuple[int, int]  # CUDA compute capability: what precision=auto picks on it

    def label(self) -> str:
        """The name and memory, for messages: "H200 (140.4 GiB)"."""
        return f"{self.name} ({self.memory_bytes / GIB:.1f} GiB)"


# memory.total as nvidia-smi reports it (MiB) on each chip with ECC on, which is below the data
# sheet's round figure by what the driver reserves; in the order matching tries them, so that
# "L40S" is not taken for an L4.
KNOWN_GPUS = (
    Gpu("H200", 143_771 * MIB, (9, 0)),  # data sheet: 141 GB HBM3e
    Gpu("H100", 81_559 * MIB, (9, 0)),  # 80 GB HBM3 (SXM and PCIe)
    Gpu("A100-80GB", 81_920 * MIB, (8, 0)),
    Gpu("A100-40GB", 40_960 * MIB, (8, 0)),
    Gpu("L40S", 46_068 * MIB, (8, 9)),  # 48 GB GDDR6
    Gpu("L4", 23_034 * MIB, (8, 9)),  # 24 GB
    Gpu("A10G", 23_028 * MIB, (8, 6)),  # 24 GB (AWS g5)
    Gpu("V100-32GB", 32_510 * MIB, (7, 0)),
    Gpu("V100-16GB", 16_160 * MIB, (7, 0)),
    Gpu("T4", 15_360 * MIB, (7, 5)),  # 16 GB
)
# Node labels that name the GPU of a node: GKE's, and NVIDIA GPU Feature Discovery's (whose
# product names carry the memory size where a chip has two: NVIDIA-A100-SXM4-40GB).
GPU_LABELS = ("cloud.google.com/gke-accelerator", "nvidia.com/gpu.product")
# GKE accelerator names without a size, for the size GKE means by them.
_GKE_UNSIZED = {"nvidia-tesla-a100": "A100-40GB", "nvidia-tesla-v100": "V100-16GB"}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 1 << 10, "MIB": MIB, "GIB": GIB, "TIB": 1 << 40, "KI": 1 << 10}
_UNITS |= {"MI": MIB, "GI": GIB, "TI": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^A-Z0-9]+", text.upper()) if w]


def find_gpu(name: str) -> Gpu | None:
    """The known GPU `name` names (any case, "NVIDIA " or not, "-" or " "), or None: each
    word of a known name must be among its words ("NVIDIA-A100-SXM4-80GB" is the A100-80GB)."""
    alias = _GKE_UNSIZED.get(name.strip().lower())
    words = _words(alias or name)
    for gpu in KNOWN_GPUS:
        if all(w in words for w in _words(gpu.name)):
            return gpu
    return None


def gpu(name: str) -> Gpu:
    """The known GPU `name` names; UserError naming the known ones when it names none."""
    found = find_gpu(name)
    if found is None:
        known = ", ".join(g.name.lower() for g in KNOWN_GPUS)
        raise UserError(
            f"--gpu {name!r} is not a GPU this plan knows; use one of {known}, or give its "
            "memory with --gpu-memory (e.g. 16GB)"
        )
    return found


def gpu_of_nodes(node_selector: Mapping[str, str]) -> Gpu | None:
    """The GPU the node selector asks for, by a GPU_LABELS label it sets; None when it names
    none or one not known."""
    for label in GPU_LABELS:
        if label in node_selector:
            return find_gpu(node_selector[label])
    return None


def parse_memory(text: str) -> int:
    """Bytes of a memory size: "16GB" (decimal), "16GiB" or "16Gi" (binary), or bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise UserError(
            f"--gpu-memory {text!r} is not a memory size; give one such as 16GB, 24GiB or 80Gi"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def unknown_gpu(memory: str) -> Gpu:
    """A GPU this module does not know, by its memory ("16GB"): its capability unknown, so
    train.precision=auto plans it in float32."""
    return Gpu(f"GPU of {memory.strip()}", parse_memory(memory), (0, 0))

"""trainer/gpus.py: the known GPUs, the names clusters give them, memory sizes."""

import pytest

from contracts.errors import UserError
from trainer import gpus
from trainer.flops import peak_flops


@pytest.mark.parametrize(
    "given, name",
    [
        ("h200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("nvidia-h200-141gb", "H200"),  # GKE's accelerator label
        ("nvidia-tesla-t4", "T4"),
        ("nvidia-tesla-a100", "A100-40GB"),  # GKE's unsized A100 is the 40 GB one
        ("nvidia-a100-80gb", "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),  # GPU Feature Discovery's product label
        ("Tesla-V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA-L40S", "L40S"),
        ("nvidia-l4", "L4"),
        ("a10g", "A10G"),
    ],
)
def test_names_find_their_gpu(given, name):
    found = gpus.find_gpu(given)
    assert found is not None and found.name == name


def test_a_gpu_that_has_a_peak_has_it_under_the_same_name():
    assert all(peak_flops(g.name) for g in gpus.KNOWN_GPUS if g.name != "A10G")


def test_unknown_and_ambiguous_names_are_refused_listing_the_known():
    assert gpus.find_gpu("a100") is None and gpus.find_gpu("mi300x") is None
    with pytest.raises(UserError, match="h200, h100, a100-80gb.*--gpu-memory"):
        gpus.gpu("a100")


def test_the_node_selector_names_the_gpu():
    assert gpus.gpu_of_nodes({"cloud.google.com/gke-accelerator": "nvidia-l4"}).name == "L4"
    assert gpus.gpu_of_nodes({"nvidia.com/gpu.product": "Tesla-T4"}).name == "T4"
    assert gpus.gpu_of_nodes({"pool": "gpu"}) is None


def test_memory_sizes():
    assert gpus.parse_memory("16GB") == 16 * 10**9
    assert gpus.parse_memory("24GiB") == gpus.parse_memory("24Gi") == 24 * gpus.GIB
    for bad in ("lots", "-1GB", "16XB", "0"):
        with pytest.raises(UserError, match="--gpu-memory"):
            gpus.parse_memory(bad)

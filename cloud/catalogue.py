"""
Published figures of the GPU models Meridian sells (vendor datasheets, SXM parts, dense math:
the sparse figures vendors headline are twice these). Loaded by a data migration so every
installation starts with a real catalogue; staff add models through the API.
"""

GPU_MODELS = [
    {
        "slug": "a100-80gb-sxm", "name": "NVIDIA A100 80GB SXM", "memory_gib": 80,
        "memory_bandwidth_tbs": "2.04", "fp16_tflops": "312.0", "fp8_tflops": None,
        "mig_max_instances": 7, "tdp_watts": 400,
    },
    {
        "slug": "h100-80gb-sxm", "name": "NVIDIA H100 80GB SXM", "memory_gib": 80,
        "memory_bandwidth_tbs": "3.35", "fp16_tflops": "989.4", "fp8_tflops": "1978.9",
        "mig_max_instances": 7, "tdp_watts": 700,
    },
    {
        "slug": "h200-141gb-sxm", "name": "NVIDIA H200 141GB SXM", "memory_gib": 141,
        "memory_bandwidth_tbs": "4.80", "fp16_tflops": "989.4", "fp8_tflops": "1978.9",
        "mig_max_instances": 7, "tdp_watts": 700,
    },
    {
        "slug": "b200-180gb-sxm", "name": "NVIDIA B200 180GB SXM", "memory_gib": 180,
        "memory_bandwidth_tbs": "7.70", "fp16_tflops": "2250.0", "fp8_tflops": "4500.0",
        "mig_max_instances": 7, "tdp_watts": 1000,
    },
]


def load_gpu_catalogue(gpu_model_class) -> None:
    """Create or refresh the catalogue rows (the data migration passes its historical model)."""
    for row in GPU_MODELS:
        gpu_model_class.objects.update_or_create(slug=row["slug"], defaults=row)

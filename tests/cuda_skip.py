"""Module-level skip for the GPU tests of the CUDA C++ kernels (one copy for every such test file)."""
import pytest
import torch


def skip_unless_cuda_kernels() -> None:
    """Skip the calling test module, with the reason, unless the CUDA C++ kernels can run here."""
    if torch.cuda.is_available():
        from gaac_hf.kernels.cuda import runtime

        reason = runtime.why_unavailable()
    else:
        reason = "no CUDA device"
    if reason is not None:
        pytest.skip(f"CUDA C++ path unavailable: {reason}", allow_module_level=True)

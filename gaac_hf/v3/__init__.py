"""GAAC block format version 3: geometry (:mod:`.format`) and the PyTorch reference codec (:mod:`.codec`).

``docs/FORMAT_V3.md`` is the prose version; ``kernels/cuda/gaac_v3/`` holds the one C++ decoder core
(host and device) and the CUDA kernels that must match :mod:`.codec` byte for byte and bit for bit.
"""
from .format import FORMAT_VERSION, GeometryV3  # noqa: F401

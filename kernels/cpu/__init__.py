"""CPU kernels for format v3: a C++ library built from the one v3 core (``kernels/cuda/gaac_v3/core.cuh``)
at first use (``native.py``), and the PyTorch definition of its attention arithmetic (``reference.py``)."""

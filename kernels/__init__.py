"""Triton kernels for GAAC, installed as ``gaac_hf.kernels``. Each kernel sits beside the reference it must match."""

"""GAAC kernels, installed as ``gaac_hf.kernels`` (the repository's top-level ``kernels/`` folder, so it
cannot shadow the PyPI package ``kernels`` that transformers probes for hub kernels).

* :mod:`.paged`: what every attention kernel takes (:class:`PagedKV`) and its launch knobs
  (:class:`LaunchConfig`); needs only torch.
* :mod:`.reference`: the fp64 attention reference the kernels are checked against (the codec kernels'
  reference is :mod:`gaac_hf.codec`).
* ``triton/``: the portable Triton kernels (encoder, decoders, fused decode attention); needs Triton.
* ``cuda/``: the Hopper CUDA C++ kernels, compiled at run time (``gaac-hf[cuda]``).

``from gaac_hf.kernels import encode`` (``decode``, ``attention``) still gives the Triton modules.
"""
from .paged import DEFAULT_LAUNCH, LaunchConfig, PagedKV, PagedTensor

__all__ = ["DEFAULT_LAUNCH", "LaunchConfig", "PagedKV", "PagedTensor"]

_TRITON_ALIASES = ("encode", "decode", "attention")


def __getattr__(name):
    # earlier public paths: gaac_hf.kernels.attention etc. were the Triton modules before triton/ existed
    if name in _TRITON_ALIASES:
        import importlib

        return importlib.import_module(f".triton.{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

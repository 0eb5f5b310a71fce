"""gaac-hf: lossless GAAC KV-cache compression for Hugging Face transformers."""
from .format import FORMAT_VERSION, BlockGeometry
from .codec import decode_blocks, decode_tensor, encode_blocks, encode_tensor

__version__ = "0.1.0"
__all__ = ["FORMAT_VERSION", "BlockGeometry", "encode_blocks", "decode_blocks", "encode_tensor", "decode_tensor"]

# The transformers integration is imported on first use, so `import gaac_hf` stays light and never
# patches transformers: registration happens only in gaac_hf.register().
_LAZY = {"GAACCache": "cache", "GAACLayer": "cache", "FP8DynamicCache": "cache", "register": "cache", "unregister": "cache"}
__all__ += list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

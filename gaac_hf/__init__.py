"""gaac-hf: lossless GAAC KV-cache compression for Hugging Face transformers."""
from .format import FORMAT_VERSION, BlockGeometry
from .codec import decode_blocks, decode_tensor, encode_blocks, encode_tensor

__version__ = "0.1.0"
__all__ = ["FORMAT_VERSION", "BlockGeometry", "encode_blocks", "decode_blocks", "encode_tensor", "decode_tensor"]

"""The reference GAAC codec in PyTorch: the executable spec of the block format.

:mod:`.reference` encodes and decodes blocks and whole tensors; :mod:`.escapes` builds and appends
to the escape heap; :mod:`.bits` holds the bit-packing helpers both use. The Triton kernels in
``gaac_hf.kernels.triton`` must match these byte for byte (encoder) and bit for bit (decoder).
"""
from .bits import join_bf16, split_bf16
from .escapes import append_escapes, escape_lengths, escape_source, pack_escapes
from .reference import (
    EncodedBlocks,
    EncodedTensor,
    decode_blocks,
    decode_tensor,
    encode_blocks,
    encode_tensor,
    group_modes,
)

__all__ = [
    "EncodedBlocks", "EncodedTensor", "append_escapes", "decode_blocks", "decode_tensor", "encode_blocks",
    "encode_tensor", "escape_lengths", "escape_source", "group_modes", "join_bf16", "pack_escapes", "split_bf16",
]

"""The Triton kernels of GAAC format v2 (need ``triton``; on the CPU they run under ``TRITON_INTERPRET=1``).

Each matches a reference: ``encode`` the reference encoder ``gaac_hf.codec.encode_blocks`` (byte for
byte), ``decode`` its decoder ``gaac_hf.codec.decode_blocks`` (bit for bit), ``attention`` the fp64
``gaac_hf.kernels.reference.attention_reference`` (BF16 tolerance) and its own BF16 twin
(``bf16_decode_attention``, bit for bit). ``_tile`` holds the device helpers they share; ``pack``
builds paged K/V from dense tensors for tests and benchmarks.
"""

"""gaac-hf inside other tools: lm-evaluation-harness (:mod:`.lm_eval`).

The transformers integration itself (the cache and the GAAC attention function with its
registration) is :mod:`gaac_hf.cache`: the cache layer reads the registration on every update.
"""

"""transformers version shims: the few places where the releases we support (5.17-5.24) differ."""
from __future__ import annotations

from transformers.cache_utils import get_layer_types_and_kwargs


def transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


# transformers < 5.18 treats a positive crop(n) as "keep n tokens"; later versions reject it.
POSITIVE_CROP_IS_LENGTH = transformers_version() < (5, 18)


def layer_types_and_kwargs(config) -> tuple[list[str], list[dict]]:
    # transformers 5.17 returns one kwargs dict for all layers, 5.23+ one dict per layer.
    types, kw = get_layer_types_and_kwargs(config)
    if isinstance(kw, dict):
        kw = [kw] * len(types)
    return list(types), list(kw)

"""F4 with sign/mantissa words (format4.SM_INPLACE): the layout of format4.py in every other respect.
A separate module so that the bench and the tests can hold both variants in one process."""
import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("format4i_impl", Path(__file__).with_name("format4.py"))
_mod = importlib.util.module_from_spec(_spec)
sys.modules["format4i_impl"] = _mod
_spec.loader.exec_module(_mod)
_mod.SM_INPLACE = True
Geometry, Encoded, encode, decode, bytes_of = _mod.Geometry, _mod.Encoded, _mod.encode, _mod.decode, _mod.bytes_of
BLOCK_T, ROWS, LANES = _mod.BLOCK_T, _mod.ROWS, _mod.LANES


def pack_pool(x, lens, base8, base16, kind, generator=None) -> dict:
    return _mod.F.pack_pool(x, lens, base8, base16, kind, generator=generator, codec=sys.modules[__name__])

"""mpc3.aes: AES-128-CTR through libcrypto (GIL released) and through pyca/cryptography
give the bytes of the reference keystream (mpc3.prg.aes_ctr_bytes)."""
import ctypes.util
import os

import numpy as np
import pytest

from mpc3 import aes
from mpc3.prg import aes_ctr_bytes

BACKENDS = {"cryptography": aes._ctr_into_cryptography}
if aes._LIB is not None:
    BACKENDS["libcrypto"] = aes._LIB.ctr_into
NONCES = [bytes(16), b"\xff" * 16, b"\x00" * 8 + b"\xff" * 8, os.urandom(16)]


def test_libcrypto_is_used_where_it_exists():
    if ctypes.util.find_library("crypto"):
        assert aes.BACKEND == "libcrypto"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("nbytes", [1, 15, 16, 17, 4096, (1 << 20) - 1, (1 << 20) + 33])
def test_ctr_equals_the_reference_keystream(backend, nbytes):
    ctr = BACKENDS[backend]
    key = os.urandom(16)
    for nonce in NONCES:                         # counters that carry and wrap mod 2^128
        out = np.full(nbytes + 8, 0xAB, dtype=np.uint8)
        ctr(key, nonce, out, nbytes)
        assert out[:nbytes].tobytes() == aes_ctr_bytes(key, nonce, nbytes)
        assert (out[nbytes:] == 0xAB).all()      # nothing written past nbytes


def test_bad_buffers_are_refused():
    with pytest.raises(ValueError):
        aes.ctr_into(bytes(16), bytes(16), np.zeros(10, np.uint8), 11)
    with pytest.raises(ValueError):
        aes.ctr_into(bytes(16), bytes(16), np.zeros((4, 4), np.uint8)[:, :2], 4)
    aes.ctr_into(bytes(16), bytes(16), np.zeros(0, np.uint8), 0)          # nothing to do

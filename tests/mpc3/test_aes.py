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


def test_nist_sp800_38a_ctr_vector():
    """F.5.1 CTR-AES128.Encrypt, block 1: the keystream is ciphertext XOR plaintext."""
    key = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
    counter = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    plain = bytes.fromhex("6bc1bee22e409f96e93d7e117393172a")
    cipher = bytes.fromhex("874d6191b620e3261bef6864990db6ce")
    for backend in (aes.ctr_into, *BACKENDS.values()):
        out = np.zeros(32, np.uint8)
        backend(key, counter, out, 16)
        assert bytes(a ^ b for a, b in zip(out[:16].tobytes(), plain)) == cipher


def test_fallback_when_libcrypto_is_missing(monkeypatch):
    monkeypatch.setattr(aes, "_LIB", None)
    key, nonce = os.urandom(16), os.urandom(16)
    for size, slack in ((100, 0), (100, 16), ((1 << 20) + 5, 0), ((1 << 20) + 5, 16)):
        out = np.zeros(size + slack, np.uint8)          # with and without update_into's slack
        aes.ctr_into(key, nonce, out, size)
        assert out[:size].tobytes() == aes_ctr_bytes(key, nonce, size)


def test_bad_arguments_are_refused():
    good = np.zeros(32, np.uint8)
    bad = [(bytes(16), bytes(16), np.zeros(10, np.uint8), 11),                 # too short
           (bytes(16), bytes(16), np.zeros((4, 4), np.uint8)[:, :2], 4),     # not contiguous
           (bytes(32), bytes(16), good, 16),                                  # AES-256 key
           (bytes(16), bytes(3), good, 16),                                   # short counter
           (bytes(16), bytes(16), np.zeros(4, np.uint64), 16),                # not bytes
           (bytes(16), bytes(16), np.frombuffer(bytes(32), np.uint8), 16)]    # read-only
    for key, nonce, out, n in bad:
        with pytest.raises(ValueError):
            aes.ctr_into(key, nonce, out, n)
    aes.ctr_into(bytes(16), bytes(16), np.zeros(0, np.uint8), 0)          # nothing to do

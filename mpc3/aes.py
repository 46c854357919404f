"""AES-128-CTR keystreams for :mod:`mpc3.prg`'s long draws, without holding the GIL.

pyca/cryptography keeps the GIL while it encrypts, so three parties as threads of one process
(and a party's job thread beside its link readers) took turns on every keystream: in a profile
of the in-process Table 2 encoder (py-spy --gil) the AES-CTR draws were a third of the time the
party threads held the GIL. OpenSSL's libcrypto called through ctypes runs with the GIL
released (ctypes drops it around every foreign call) at the same ~10 GB/s. Short draws stay
with cryptography (:data:`mpc3.prg.ECB_MAX_BYTES`): five foreign calls that each hand the GIL
to another party thread and wait for it back made a decode step 15 % slower.

:data:`BACKEND` is ``"libcrypto"`` when the library loads and reproduces cryptography's
keystream on a self-test vector at import, else ``"cryptography"`` (the same function through
pyca/cryptography); both give the same bytes for the same key and counter block
(tests/test_aes.py).
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

#: Input of the CTR chunks (the keystream is the encryption of zeros).
_ZEROS = bytes(1 << 20)


# --------------------------------------------------------------- pyca/cryptography ----
def _ctr_into_cryptography(key: bytes, nonce: bytes, out: np.ndarray, nbytes: int) -> None:
    enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    for pos in range(0, nbytes, len(_ZEROS)):
        chunk = min(len(_ZEROS), nbytes - pos)
        out[pos:pos + chunk] = np.frombuffer(enc.update(memoryview(_ZEROS)[:chunk]), np.uint8)


# ------------------------------------------------------------------------ libcrypto ----
class _LibCrypto:
    """The few EVP calls of OpenSSL >= 1.1 that AES-128-CTR/ECB need."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        lib.EVP_CIPHER_CTX_new.restype = vp
        lib.EVP_CIPHER_CTX_new.argtypes = []
        lib.EVP_CIPHER_CTX_free.restype = None
        lib.EVP_CIPHER_CTX_free.argtypes = [vp]
        lib.EVP_aes_128_ctr.restype = vp
        lib.EVP_aes_128_ctr.argtypes = []
        lib.EVP_EncryptInit_ex.restype = i
        lib.EVP_EncryptInit_ex.argtypes = [vp, vp, vp, cp, cp]
        lib.EVP_EncryptUpdate.restype = i
        lib.EVP_EncryptUpdate.argtypes = [vp, vp, ctypes.POINTER(i), vp, i]
        self.lib = lib
        self.ctr = lib.EVP_aes_128_ctr()
        if not self.ctr:
            raise OSError("libcrypto has no AES-128-CTR")
        self.zeros = ctypes.c_char_p(_ZEROS)

    def ctr_into(self, key: bytes, nonce: bytes, out: np.ndarray, nbytes: int) -> None:
        lib, dst = self.lib, out.ctypes.data
        ctx = lib.EVP_CIPHER_CTX_new()
        if not ctx:
            raise MemoryError("EVP_CIPHER_CTX_new failed")
        try:
            if lib.EVP_EncryptInit_ex(ctx, self.ctr, None, key, nonce) != 1:
                raise RuntimeError("EVP_EncryptInit_ex failed")
            outl = ctypes.c_int()
            step = len(_ZEROS)
            for pos in range(0, nbytes, step):           # the keystream is E(zeros)
                chunk = min(step, nbytes - pos)
                if lib.EVP_EncryptUpdate(ctx, dst + pos, ctypes.byref(outl), self.zeros,
                                         chunk) != 1 or outl.value != chunk:
                    raise RuntimeError("EVP_EncryptUpdate failed")
        finally:
            lib.EVP_CIPHER_CTX_free(ctx)



def _load() -> _LibCrypto | None:
    """libcrypto if it loads and its keystream equals cryptography's on a test vector."""
    path = ctypes.util.find_library("crypto")
    if not path:
        return None
    try:
        lib = _LibCrypto(path)
        key, nonce = bytes(range(16)), b"\xff" * 15 + b"\xfe"      # the counter wraps
        got, want = np.empty(100, np.uint8), np.empty(100, np.uint8)
        lib.ctr_into(key, nonce, got, 100)
        _ctr_into_cryptography(key, nonce, want, 100)
        return lib if np.array_equal(got, want) else None
    except (OSError, AttributeError, RuntimeError, MemoryError):
        return None


_LIB = _load()
BACKEND = "libcrypto" if _LIB is not None else "cryptography"


def ctr_into(key: bytes, nonce: bytes, out: np.ndarray, nbytes: int) -> None:
    """Write ``nbytes`` of the AES-128-CTR keystream of (key, 16-byte initial counter block)
    into ``out`` (uint8, contiguous, at least ``nbytes`` long)."""
    if nbytes <= 0:
        return
    if out.size < nbytes or not out.flags.c_contiguous:
        raise ValueError("ctr_into: the output buffer is too short or not contiguous")
    if _LIB is not None:
        _LIB.ctr_into(key, nonce, out, nbytes)
    else:
        _ctr_into_cryptography(key, nonce, out, nbytes)

"""AES-128-CTR keystreams for :mod:`mpc3.prg`'s long draws, without holding the GIL.

pyca/cryptography keeps the GIL while it encrypts, so three parties as threads of one process
(and a party's job thread beside its link readers) took turns on every keystream: in a profile
of the in-process Table 2 encoder (py-spy --gil) the AES-CTR draws were a third of the time the
party threads held the GIL. OpenSSL's libcrypto called through ctypes runs with the GIL
released (ctypes drops it around every foreign call) at the same ~10 GB/s. Short draws stay
with cryptography (:data:`mpc3.prg.ECB_MAX_BYTES`): through ctypes each made five foreign
calls, each handing the GIL to another party thread and waiting for it back, and a decode step
took 1.17x as long.

:data:`BACKEND` is ``"libcrypto"`` when the library loads (Linux only: macOS aborts a process
that loads its unversioned libcrypto) and reproduces cryptography's keystream on a self-test
vector at import, else ``"cryptography"`` (the same keystream through pyca/cryptography, logged
once); tests/mpc3/test_aes.py checks both against the reference and a NIST SP 800-38A vector.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

#: Input of the CTR chunks (the keystream is the encryption of zeros).
_ZEROS = bytes(1 << 20)


# --------------------------------------------------------------- pyca/cryptography ----
def _ctr_into_cryptography(key: bytes, nonce: bytes, out: np.ndarray, nbytes: int) -> None:
    """Straight into ``out`` where it has the 15 bytes of slack cryptography's update_into
    asks for (mpc3.prg's buffers do), else through a copy."""
    enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    for pos in range(0, nbytes, len(_ZEROS)):
        chunk = min(len(_ZEROS), nbytes - pos)
        src = memoryview(_ZEROS)[:chunk]
        if out.size - pos >= chunk + 15:
            enc.update_into(src, out[pos:])
        else:
            out[pos:pos + chunk] = np.frombuffer(enc.update(src), np.uint8)


# ------------------------------------------------------------------------ libcrypto ----
class _LibCrypto:
    """The few EVP calls of OpenSSL >= 1.1 that AES-128-CTR needs."""

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
            for pos in range(0, nbytes, step):           # one context: the counter runs on
                chunk = min(step, nbytes - pos)
                if lib.EVP_EncryptUpdate(ctx, dst + pos, ctypes.byref(outl), self.zeros,
                                         chunk) != 1 or outl.value != chunk:
                    raise RuntimeError("EVP_EncryptUpdate failed")
        finally:
            lib.EVP_CIPHER_CTX_free(ctx)


def _load() -> _LibCrypto | None:
    """libcrypto if it loads and its keystream equals cryptography's on a test vector."""
    path = ctypes.util.find_library("crypto") if sys.platform.startswith("linux") else None
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
if _LIB is None:
    logging.getLogger("mpc3.aes").info(
        "libcrypto not usable: long PRG draws run through pyca/cryptography, holding the GIL")


def ctr_into(key: bytes, nonce: bytes, out: np.ndarray, nbytes: int) -> None:
    """Write ``nbytes`` of the AES-128-CTR keystream of (16-byte key, 16-byte initial counter
    block) into ``out`` (writable, contiguous uint8, at least ``nbytes`` long)."""
    if len(key) != 16 or len(nonce) != 16:
        raise ValueError("ctr_into: AES-128 takes a 16-byte key and a 16-byte counter block")
    if out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable \
            or out.size < nbytes:
        raise ValueError("ctr_into: the output must be a writable, contiguous uint8 buffer of "
                         f"at least {nbytes} bytes")
    if nbytes <= 0:
        return
    if _LIB is not None:
        _LIB.ctr_into(key, nonce, out, nbytes)
    else:
        _ctr_into_cryptography(key, nonce, out, nbytes)

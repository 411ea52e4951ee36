"""The digest the caches key files by, without importing ``hashlib``: that loads OpenSSL's libcrypto
(~10 ms of CPU in every start), while its ``blake2b`` is this builtin module's anyway."""

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python built without the module
    from hashlib import blake2b

__all__ = ["blake2b"]

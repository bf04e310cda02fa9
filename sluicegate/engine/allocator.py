"""Handing back to the system what the C allocator keeps free.

A restore allocates and frees a great deal between the rows it keeps (the changelog's
records, the merges of a memory store's recent rows into its packed blocks), and glibc's
malloc keeps most of what is freed for later rather than returning it: RSS counts it. One
`malloc_trim(0)` once every assigned partition is restored returns it (bench/NOTES.md: a
worker holding a million queued starts, 669 MB once restored, 576 MB after it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_trim: object = None  # the libc function once looked up; False where there is none


def give_back_free_memory() -> bool:
    """`malloc_trim(0)`, where the C library has it (glibc); whether it was called."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim is False:
        return False
    try:
        _trim(0)  # type: ignore[operator]
    except OSError:  # pragma: no cover - a C library that refuses it
        log.debug("malloc_trim failed", exc_info=True)
        return False
    return True

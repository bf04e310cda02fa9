from __future__ import annotations

import ctypes.util

import pytest

from sluicegate.engine import allocator


def test_free_memory_is_given_back_where_the_c_library_can() -> None:
    if not ctypes.util.find_library("c"):
        pytest.skip("no C library to ask")
    # glibc (the project's images and CI) has malloc_trim; a C library without it (musl)
    # makes it a no-op that says so rather than an error.
    called = allocator.give_back_free_memory()
    assert called == hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim")
    assert allocator.give_back_free_memory() == called

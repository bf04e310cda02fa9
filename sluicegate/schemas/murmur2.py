"""The Java Kafka client's default partitioner, so that our keys land on the
partitions any other client (and librdkafka's ``murmur2_random``) would pick.

A port of ``org.apache.kafka.common.utils.Utils.murmur2``: 32-bit arithmetic,
seed 0x9747b28c, result as Java's signed int. The same in C (`_speedups`, a tenth of
the cost) is used when in use (`native`); this Python one is its reference in the tests
and the fallback.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from sluicegate.schemas.native import speedups

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def python_murmur2(data: bytes) -> int:
    """Java ``Utils.murmur2(data)``: a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def python_partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner picks for a keyed record."""
    if partitions < 1:
        raise ValueError(f"a topic has at least 1 partition, got {partitions}")
    return (python_murmur2(key) & 0x7FFFFFFF) % partitions


murmur2: Callable[[bytes], int] = python_murmur2
partition_for: Callable[[bytes, int], int] = python_partition_for
if speedups is not None:
    murmur2, partition_for = speedups.murmur2, speedups.partition_for

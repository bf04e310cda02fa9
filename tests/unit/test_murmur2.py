"""Our partitioner puts keys where the Java client (and librdkafka's murmur2_random) does,
in C and in the Python it mirrors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.schemas.murmur2 import (
    murmur2,
    partition_for,
    python_murmur2,
    python_partition_for,
)

HASHES = [pytest.param(murmur2, id="native"), pytest.param(python_murmur2, id="python")]
PARTITIONERS = [pytest.param(partition_for, id="native"),
                pytest.param(python_partition_for, id="python")]

# org.apache.kafka.common.utils.UtilsTest.testMurmur2, plus the empty array.
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"", 275646681),
]


@pytest.mark.parametrize("hash_", HASHES)
@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_the_java_clients_test_vectors(
        hash_: Callable[[bytes], int], data: bytes, expected: int) -> None:
    assert hash_(data) == expected


@given(data=st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int_the_same_in_c_and_python(data: bytes) -> None:
    assert -(2**31) <= murmur2(data) < 2**31
    assert murmur2(data) == python_murmur2(data)


@given(key=st.binary(max_size=64), partitions=st.integers(min_value=1, max_value=10_000))
def test_partition_is_always_one_of_the_topics_partitions(key: bytes, partitions: int) -> None:
    assert 0 <= partition_for(key, partitions) < partitions
    assert partition_for(key, partitions) == python_partition_for(key, partitions)


@pytest.mark.parametrize("partition_of", PARTITIONERS)
def test_partition_uses_the_positive_hash_like_the_java_client(
        partition_of: Callable[[bytes, int], int]) -> None:
    # murmur2(b"foobar") is negative: the sign bit is masked off, not abs()'d.
    assert partition_of(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50 == 16


@pytest.mark.parametrize("partition_of", PARTITIONERS)
def test_a_topic_without_partitions_is_refused(
        partition_of: Callable[[bytes, int], int]) -> None:
    with pytest.raises(ValueError, match="at least 1 partition"):
        partition_of(b"k", 0)


def test_partition_matches_librdkafka_murmur2_random_on_a_mock_cluster() -> None:
    kafka = pytest.importorskip("confluent_kafka")
    # librdkafka's in-process mock cluster auto-creates topics with 4 partitions.
    producer = kafka.Producer(
        {"test.mock.num.brokers": 1, "partitioner": "murmur2_random", "log_level": 0}
    )
    keys = [f"exec-{i}".encode() for i in range(200)] + [b"21", b"foobar", b"abc"]
    placed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for key in keys:
        producer.produce("sg.murmur2-check", key=key, value=b"", on_delivery=delivered)
    assert producer.flush(30) == 0
    partitions = len(producer.list_topics("sg.murmur2-check").topics["sg.murmur2-check"].partitions)
    assert partitions > 1
    assert placed == {key: partition_for(key, partitions) for key in keys}

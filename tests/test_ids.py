"""Schedule ids: UUID version 7, growing with time, so inserts land at the index's right edge."""

from __future__ import annotations

import itertools
import time
import uuid

from duejobs import ids


def test_a_single_id_is_a_version_7_uuid_stamped_with_its_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    made = ids.new_id()
    after = time.time_ns() // 1_000_000
    assert made.version == 7 and made.variant == uuid.RFC_4122
    assert before <= made.int >> 80 <= after
    assert len({ids.new_id() for _ in range(10_000)}) == 10_000


def test_a_bulk_stream_of_ids_increases_across_blocks() -> None:
    drawn = [uuid.UUID(bytes=raw) for raw in itertools.islice(ids.id_stream(), 5_000)]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in drawn)
    assert drawn == sorted(drawn) and len(set(drawn)) == len(drawn)  # 5 blocks, one ms or more


def test_the_random_share_of_ids_covers_zero_to_one() -> None:
    shares = [ids.random_share(ids.new_id()) for _ in range(2_000)]
    assert all(0 <= s < 1 for s in shares)
    assert sum(s < 0.25 for s in shares) > 300 and sum(s >= 0.75 for s in shares) > 300

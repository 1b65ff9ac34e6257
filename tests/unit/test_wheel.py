from __future__ import annotations

import itertools

import pytest
from chronowheel.core.wheel import TimingWheel
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.property_budget import examples

DAY = 86_400_000
T0 = 1_796_115_600_000  # 2026-12-01T09:00:00Z


# --------------------------------------------------------------------------- unit tests


def test_fires_in_due_order_and_never_early() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=T0)
    w.insert("c", T0 + 30, 3)
    w.insert("a", T0 + 10, 1)
    w.insert("b", T0 + 20, 2)
    assert w.advance(T0 + 9) == []
    assert w.advance(T0 + 20) == [(T0 + 10, "a", 1), (T0 + 20, "b", 2)]
    assert len(w) == 1
    assert w.advance(T0 + 1000) == [(T0 + 30, "c", 3)]
    assert len(w) == 0
    assert w.next_deadline() is None


def test_sub_tick_precision() -> None:
    w: TimingWheel[str, None] = TimingWheel(start_ms=1000, tick_ms=10)
    w.insert("x", 1017, None)
    w.insert("y", 1013, None)
    assert w.advance(1012) == []
    assert w.advance(1013) == [(1013, "y", None)]
    assert w.next_deadline() == 1017
    assert w.advance(1016) == []
    assert w.advance(1017) == [(1017, "x", None)]


def test_sub_tick_entry_inserted_into_current_tick() -> None:
    w: TimingWheel[str, None] = TimingWheel(start_ms=1000, tick_ms=100)
    assert w.advance(1050) == []
    w.insert("later", 1099, None)
    w.insert("now", 1050, None)
    assert w.next_deadline() == 1050
    assert w.advance(1050) == [(1050, "now", None)]
    assert w.advance(1098) == []
    assert w.advance(1099) == [(1099, "later", None)]


def test_replace_moves_timer_and_value() -> None:
    w: TimingWheel[str, str] = TimingWheel(start_ms=0)
    w.insert("k", 500, "old")
    w.insert("k", 100, "new")
    assert len(w) == 1
    assert w.get("k") == (100, "new")
    assert w.advance(499) == [(100, "k", "new")]
    assert w.advance(10_000) == []


def test_cancel() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=0)
    w.insert("k", 5 * DAY, 1)
    assert "k" in w
    assert w.cancel("k") is True
    assert w.cancel("k") is False
    assert "k" not in w
    assert w.get("k") is None
    assert w.advance(6 * DAY) == []
    assert w.next_deadline() is None


def test_already_due_at_insert_comes_out_next_advance() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=T0)
    w.advance(T0 + 5000)
    w.insert("late", T0 + 100, 1)
    w.insert("way-late", T0 - DAY, 2)
    w.insert("now", T0 + 5000, 3)
    assert w.next_deadline() == T0 - DAY
    assert w.advance(T0 + 5000) == [
        (T0 - DAY, "way-late", 2),
        (T0 + 100, "late", 1),
        (T0 + 5000, "now", 3),
    ]


def test_older_now_fires_only_what_it_reaches() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=T0)
    w.advance(T0 + 5000)
    w.insert("late", T0 + 100, 1)
    w.insert("way-late", T0 - DAY, 2)
    # The clock does not go back, and nothing after the given now comes out.
    assert w.advance(T0) == [(T0 - DAY, "way-late", 2)]
    assert w.advance(T0 + 99) == []
    assert w.advance(T0 + 100) == [(T0 + 100, "late", 1)]


def test_cut_then_finish_the_last_millisecond() -> None:
    # The node's pattern: a max_batch cut, then advance(last fired due) completes that ms only.
    w: TimingWheel[int, None] = TimingWheel(start_ms=0)
    for i in range(10):
        w.insert(i, 100, None)
    for i in range(10, 15):
        w.insert(i, 101, None)
    first = w.advance(200, max_batch=4)
    assert [d for d, _, _ in first] == [100] * 4
    rest = w.advance(first[-1][0])
    assert [d for d, _, _ in rest] == [100] * 6
    assert w.next_deadline() == 101
    assert [d for d, _, _ in w.advance(200)] == [101] * 5


def test_older_now_is_ignored() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=0)
    w.insert("a", 100, 1)
    w.advance(50)
    assert w.advance(10) == []
    assert w.advance(99) == []
    assert w.advance(100) == [(100, "a", 1)]


def test_far_future_thirty_days_and_ten_years_at_1ms() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=T0, tick_ms=1, wheel_size=256)
    w.insert("month", T0 + 30 * DAY + 7, 1)
    w.insert("decade", T0 + 3653 * DAY + 1, 2)
    assert w.advance(T0 + 30 * DAY + 6) == []
    assert w.advance(T0 + 30 * DAY + 7) == [(T0 + 30 * DAY + 7, "month", 1)]
    assert w.advance(T0 + 3653 * DAY) == []
    assert w.advance(T0 + 3653 * DAY + 1) == [(T0 + 3653 * DAY + 1, "decade", 2)]


def test_max_batch_splits_a_herd_in_order() -> None:
    w: TimingWheel[int, int] = TimingWheel(start_ms=0)
    for i in range(1000):
        w.insert(i, 1000 + i % 7, i)
    w.insert(-1, 1001, -1)
    got: list[tuple[int, int, int]] = []
    calls = 0
    while True:
        batch = w.advance(2000, max_batch=64)
        if not batch:
            break
        assert len(batch) <= 64
        got.extend(batch)
        calls += 1
        if calls == 3:
            # Inserts and cancels in the middle of a cut batch keep order and lose nothing.
            w.insert(5000, 1003, 5000)
            w.cancel(-1)
    dues = [d for d, _, _ in got]
    assert len(got) == 1001
    assert calls == 16
    assert dues == sorted(dues)
    assert -1 not in {k for _, k, _ in got}


def test_herd_on_one_millisecond_in_batches() -> None:
    w: TimingWheel[int, int] = TimingWheel(start_ms=T0)
    for i in range(20_000):
        w.insert(i, T0 + 60_000, i)
    w.insert(-1, T0 + 60_001, -1)
    assert w.advance(T0 + 59_999) == []
    fired: set[int] = set()
    cancelled = 0
    calls = 0
    while batch := w.advance(T0 + 60_000, max_batch=5_000):
        calls += 1
        assert len(batch) <= 5_000
        assert {d for d, _, _ in batch} == {T0 + 60_000}
        fired.update(k for _, k, _ in batch)
        if calls == 2:
            # Cancels in the middle of a herd are honoured.
            cancelled = sum(w.cancel(k) for k in range(0, 20_000, 2))
    assert cancelled > 0
    assert len(fired) + cancelled == 20_000
    assert calls == 3
    assert len(w) == 1
    assert w.advance(T0 + 60_001) == [(T0 + 60_001, -1, -1)]


class _CountingKey:
    """A key that counts how often it is hashed: each dict or set lookup hashes it once."""

    __slots__ = ("n",)
    hashes = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        _CountingKey.hashes += 1
        return hash(self.n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CountingKey) and other.n == self.n


def test_herd_cascaded_late_fires_in_batches_without_ordering_all_of_it() -> None:
    # A driver that wakes late (its loop was busy) finds the herd inside a level-1 bucket that
    # must be cascaded. The herd shares one due_ms, so batches need no heap over all of it:
    # a cut costs O(batch), not O(herd) per batch (which made a 1,000,000-job herd crawl).
    herd = 10_000
    w: TimingWheel[_CountingKey, int] = TimingWheel(start_ms=0)
    keys = [_CountingKey(i) for i in range(herd)]
    for k in keys:
        w.insert(k, 1_000, k.n)
    later = _CountingKey(-1)
    w.insert(later, 1_010, -1)
    _CountingKey.hashes = 0
    fired: list[int] = []
    while batch := w.advance(1_005, max_batch=500):
        assert len(batch) <= 500
        assert {d for d, _, _ in batch} == {1_000}
        fired.extend(v for _, _, v in batch)
    assert sorted(fired) == list(range(herd))
    # Two lookups per entry to cascade it, one to fire it; ordering the whole herd with a heap
    # (and validating each pop) would take six.
    assert _CountingKey.hashes < 4 * herd, _CountingKey.hashes
    assert w.next_deadline() == 1_010
    assert w.advance(1_010) == [(1_010, later, -1)]


def test_cascaded_mixed_dues_still_fire_in_order_across_cuts() -> None:
    w: TimingWheel[int, int] = TimingWheel(start_ms=0)
    dues = {i: 1_000 + i % 7 for i in range(3_000)}  # 1000..1006, interleaved
    for k, d in dues.items():
        w.insert(k, d, k)
    got: list[int] = []
    while batch := w.advance(1_004, max_batch=256):
        assert len(batch) <= 256
        got.extend(d for d, _, _ in batch)
    assert got == sorted(got) and max(got) == 1_004  # in order, nothing early
    assert len(got) == sum(1 for d in dues.values() if d <= 1_004)
    assert w.next_deadline() == 1_005
    rest = w.advance(1_006)
    assert [d for d, _, _ in rest] == sorted(d for d in dues.values() if d > 1_004)


def test_big_bucket_is_cascaded_in_chunks_before_its_start() -> None:
    w: TimingWheel[int, int] = TimingWheel(start_ms=0, cascade_chunk=1000)
    # 10,000 timers in one level-2 bucket (65,536..131,071 ms at 1 ms x 256 slots).
    dues = {i: 70_000 + (i * 37) % 60_000 for i in range(10_000)}
    for k, d in dues.items():
        w.insert(k, d, k)
    deadline = w.next_deadline()
    assert deadline is not None
    assert 60_000 < deadline < 65_536  # woken ahead of the bucket's start (65,536)
    now = deadline
    assert w.advance(now) == []
    chunks = 1
    while w.next_deadline() == now + 1:  # "come back next ms" while the cascade runs
        now += 1
        w.cancel(chunks)  # cancels during the cascade are honoured wherever the timer is
        del dues[chunks]
        assert w.get(5_000) == (dues[5_000], 5_000)
        assert w.advance(now) == []
        chunks += 1
    assert chunks == 10  # 10,000 timers / 1,000 per call
    fired: list[tuple[int, int, int]] = []
    while (deadline := w.next_deadline()) is not None:
        now = max(now, deadline)
        fired.extend(w.advance(now))
    assert [d for d, _, _ in fired] == sorted(dues.values())
    assert {k for _, k, _ in fired} == set(dues)


def test_late_driver_still_gets_a_staged_bucket_in_order() -> None:
    w: TimingWheel[int, None] = TimingWheel(start_ms=0, cascade_chunk=10)
    for i in range(500):
        w.insert(i, 65_536 + i, None)
    deadline = w.next_deadline()
    assert deadline is not None and deadline < 65_536
    assert w.advance(deadline) == []  # starts the chunked cascade
    # The driver oversleeps: everything is placed at once, nothing early, order kept.
    fired = w.advance(65_700)
    assert [d for d, _, _ in fired] == list(range(65_536, 65_701))
    assert len(w) == 500 - 165


def test_staging_while_current_tick_is_partly_due() -> None:
    # Sub-tick entries wait in an ordered current tick when a big bucket starts staging; the
    # bucket's first-tick entries must join that order.
    w: TimingWheel[int, None] = TimingWheel(start_ms=0, tick_ms=10, wheel_size=4, cascade_chunk=100)
    for i in range(10_000):
        w.insert(i, 160 + i % 160, None)
    w.insert(-1, 128, None)
    assert w.advance(125) == []  # -1 is in the current tick, not due; staging begins
    assert w.next_deadline() == 126
    assert w.advance(128) == [(128, -1, None)]
    fired = w.advance(165)
    assert [d for d, _, _ in fired] == sorted(160 + i % 160 for i in range(10_000) if i % 160 < 6)


def _staged_wheel() -> tuple[TimingWheel[int, int], int]:
    # 1,000 timers in the level-2 bucket starting at 65,536 ms, split completely ahead of it.
    w: TimingWheel[int, int] = TimingWheel(start_ms=0, cascade_chunk=100)
    for i in range(1_000):
        w.insert(i, 65_536 + i * 50, i)
    deadline = w.next_deadline()
    assert deadline == 65_536 - 504  # lead: 500 ms + 4 µs per timer
    now = deadline
    assert w.advance(now) == []
    calls = 1
    while w.next_deadline() == now + 1:
        now += 1
        assert w.advance(now) == []
        calls += 1
    assert calls == 10
    assert w.next_deadline() == 65_536
    return w, now


def test_cancel_and_replace_inside_a_split_bucket() -> None:
    w, now = _staged_wheel()
    assert w.cancel(500)
    assert w.get(500) is None
    assert w.get(501) == (65_536 + 501 * 50, 501)
    w.insert(502, 65_536 + 7, -502)  # moves within the staged bucket
    w.insert(503, 200_000, -503)  # moves out of it
    fired: list[tuple[int, int, int]] = []
    while (deadline := w.next_deadline()) is not None:
        now = max(now, deadline)
        fired.extend(w.advance(now))
    assert len(fired) == 999
    assert [d for d, _, _ in fired] == sorted(d for d, _, _ in fired)
    assert (65_536 + 7, 502, -502) in fired
    assert fired[-1] == (200_000, 503, -503)


def test_cancelling_every_timer_of_a_split_bucket_drops_it() -> None:
    w, _ = _staged_wheel()
    for i in range(1_000):
        assert w.cancel(i)
    assert len(w) == 0
    assert w.next_deadline() is None
    assert w.advance(10**6) == []


def test_next_deadline_is_a_lower_bound_that_converges() -> None:
    w: TimingWheel[str, None] = TimingWheel(start_ms=0, wheel_size=16)
    w.insert("a", 123_456, None)
    now = 0
    wakeups = 0
    while True:
        deadline = w.next_deadline()
        assert deadline is not None
        assert now <= deadline <= 123_456
        now = deadline
        wakeups += 1
        fired = w.advance(now)
        if fired:
            assert fired == [(123_456, "a", None)]
            break
    assert wakeups <= 6  # at most one early wake-up per level


def test_a_timer_moved_later_within_the_current_tick_does_not_hold_the_deadline_back() -> None:
    # Found by the state machine: due 0, then moved to 1 within the same 2 ms tick. The bound
    # stayed at 0, so a driver following next_deadline called advance(0) forever.
    w: TimingWheel[int, str] = TimingWheel(start_ms=0, tick_ms=2, wheel_size=2, cascade_chunk=1)
    w.insert(0, 0, "a")
    w.insert(0, 1, "b")
    assert w.advance(0) == []
    assert w.next_deadline() == 1
    assert w.advance(1) == [(1, 0, "b")]
    assert w.next_deadline() is None


def test_next_deadline_exact_at_level_zero() -> None:
    w: TimingWheel[str, None] = TimingWheel(start_ms=0)
    w.insert("a", 200, None)
    assert w.next_deadline() == 200


def test_get_everywhere() -> None:
    w: TimingWheel[str, int] = TimingWheel(start_ms=0, wheel_size=4)
    for i, due in enumerate([0, 1, 3, 17, 64, 1000, 10**9]):
        w.insert(f"k{i}", due, i)
    w.advance(2)
    assert w.get("k0") is None
    assert w.get("k2") == (3, 2)
    assert w.get("k3") == (17, 3)
    assert w.get("k6") == (10**9, 6)


def test_negative_and_unaligned_start() -> None:
    w: TimingWheel[str, None] = TimingWheel(start_ms=-1234, tick_ms=7, wheel_size=8)
    w.insert("a", -1000, None)
    w.insert("b", -1300, None)
    w.insert("c", 5, None)
    assert w.advance(-1001) == [(-1300, "b", None)]
    assert w.advance(4) == [(-1000, "a", None)]
    assert w.advance(5) == [(5, "c", None)]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        TimingWheel(start_ms=0, tick_ms=0)
    with pytest.raises(ValueError):
        TimingWheel(start_ms=0, wheel_size=100)
    with pytest.raises(ValueError):
        TimingWheel(start_ms=0, wheel_size=1)
    with pytest.raises(ValueError):
        TimingWheel(start_ms=0, cascade_chunk=0)
    w: TimingWheel[str, None] = TimingWheel(start_ms=0)
    with pytest.raises(ValueError):
        w.advance(1, max_batch=0)


def test_many_timers_driver_loop() -> None:
    # A driver that sleeps until next_deadline and advances fires everything exactly once.
    w: TimingWheel[int, int] = TimingWheel(start_ms=0, tick_ms=1, wheel_size=32)
    dues = {i: (i * 7919) % 200_000 + 1 for i in range(3000)}
    for k, d in dues.items():
        w.insert(k, d, k)
    for k in range(0, 3000, 10):
        w.cancel(k)
        del dues[k]
    fired: list[tuple[int, int, int]] = []
    now = 0
    while (deadline := w.next_deadline()) is not None:
        now = max(now, deadline)
        fired.extend(w.advance(now, max_batch=50))
    assert [d for d, _, _ in fired] == sorted(dues.values())
    assert {k: d for d, k, _ in fired} == dues


@pytest.mark.parametrize("size", [2, 4, 256])
@pytest.mark.parametrize("tick", [1, 3])
@pytest.mark.parametrize("stride", [1, 5, 17])
def test_exhaustive_small_boundaries(size: int, tick: int, stride: int) -> None:
    # Every first jump 0..79 then fixed strides: hits every bucket edge on several levels.
    for first in range(80):
        w: TimingWheel[int, None] = TimingWheel(start_ms=0, tick_ms=tick, wheel_size=size)
        for due in range(100):
            w.insert(due, due, None)
        pending = set(range(100))
        now = first
        while pending:
            fired = [d for d, _, _ in w.advance(now)]
            expected = sorted(d for d in pending if d <= now)
            assert fired == expected, (first, now)
            pending.difference_update(fired)
            now += stride


# --------------------------------------------------------------------------- model-based

offsets = st.one_of(
    st.integers(-50, 50),
    st.integers(-5, 3000),
    st.integers(0, 2_000_000),
    st.integers(0, 40 * DAY),
    st.sampled_from([30 * DAY, 3653 * DAY, 3653 * DAY + 1]),
)
steps = st.one_of(
    st.integers(-20, 20),
    st.integers(0, 300),
    st.integers(0, 100_000),
    st.integers(0, 40 * DAY),
    st.just(4000 * DAY),
)


class WheelMachine(RuleBasedStateMachine):
    """The wheel against a plain dict model: same set fired, never early, nothing lost,
    nothing twice, nondecreasing due order (late inserts excepted), max_batch respected."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, tuple[int, int]] = {}
        self.values = itertools.count()
        self.watermark: int | None = None  # largest due fired so far (of in-order entries)
        self.late: set[int] = set()  # keys inserted with a due before the watermark
        self.now = 0
        self.wheel: TimingWheel[int, int] = TimingWheel(start_ms=0)

    @initialize(
        start=st.one_of(st.integers(-(10**6), 10**6), st.just(T0)),
        tick=st.sampled_from([1, 1, 2, 3, 10, 1000]),
        size=st.sampled_from([2, 4, 8, 256]),
        chunk=st.sampled_from([1, 2, 3, 8192]),
    )
    def setup(self, start: int, tick: int, size: int, chunk: int) -> None:
        self.now = start
        self.wheel = self.make_wheel(start, tick, size, chunk)

    def make_wheel(self, start: int, tick: int, size: int, chunk: int) -> TimingWheel[int, int]:
        return TimingWheel(start_ms=start, tick_ms=tick, wheel_size=size, cascade_chunk=chunk)

    @rule(key=st.integers(0, 30), offset=offsets)
    def insert(self, key: int, offset: int) -> None:
        due = self.now + offset
        value = next(self.values)
        self.wheel.insert(key, due, value)
        self.model[key] = (due, value)
        self.late.discard(key)
        if self.watermark is not None and due < self.watermark:
            self.late.add(key)

    @rule(key=st.integers(0, 30))
    def cancel(self, key: int) -> None:
        assert self.wheel.cancel(key) == (key in self.model)
        self.model.pop(key, None)
        self.late.discard(key)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def cancel_existing(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        self.cancel(key)

    @rule(step=steps, batch=st.one_of(st.none(), st.integers(1, 5)))
    def advance(self, step: int, batch: int | None) -> None:
        self.now = max(self.now, self.now + step)
        self._advance_and_check(self.now + min(step, 0), batch)

    @rule(batch=st.one_of(st.none(), st.integers(1, 3)))
    def advance_same_now(self, batch: int | None) -> None:
        # A driver told "call again now" (chunked cascade, batch remainder) does just that.
        self._advance_and_check(self.now, batch)

    @rule(batch=st.one_of(st.none(), st.integers(1, 3)))
    def advance_to_next_deadline(self, batch: int | None) -> None:
        deadline = self.wheel.next_deadline()
        if deadline is not None and deadline > self.now:
            self.now = deadline
        self._advance_and_check(self.now, batch)

    def _advance_and_check(self, now_arg: int, batch: int | None) -> None:
        fired = self.wheel.advance(now_arg, max_batch=batch)
        expected = sorted((due, k) for k, (due, _) in self.model.items() if due <= now_arg)
        want = len(expected) if batch is None else min(batch, len(expected))
        assert len(fired) == want
        dues = [d for d, _, _ in fired]
        assert dues == sorted(dues)
        assert dues == [d for d, _ in expected[:want]]
        seen: set[int] = set()
        for due, key, value in fired:
            assert key not in seen
            seen.add(key)
            assert due <= now_arg  # never early, never past the given now
            assert self.model.pop(key) == (due, value)
            if key in self.late:
                self.late.discard(key)
            else:
                assert self.watermark is None or due >= self.watermark
                self.watermark = due

    @rule(key=st.integers(0, 30))
    def get(self, key: int) -> None:
        assert self.wheel.get(key) == self.model.get(key)

    @invariant()
    def sizes_agree(self) -> None:
        assert len(self.wheel) == len(self.model)
        for key in range(0, 31, 5):
            assert (key in self.wheel) == (key in self.model)

    @invariant()
    def deadline_never_after_earliest(self) -> None:
        deadline = self.wheel.next_deadline()
        if not self.model:
            assert deadline is None
        else:
            assert deadline is not None
            assert deadline <= min(due for due, _ in self.model.values())

    def teardown(self) -> None:
        # Drain: a driver following next_deadline gets everything, in order, in few steps.
        calls = 0
        while self.model:
            calls += 1
            assert calls < 100 * (len(self.model) + 1) * 8
            self.advance_to_next_deadline(None)


TestWheelMachine = WheelMachine.TestCase
TestWheelMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


@settings(max_examples=examples(200), deadline=None)
@given(
    dues=st.lists(st.integers(0, 100_000), max_size=300),
    cancels=st.sets(st.integers(0, 299)),
    step=st.integers(1, 5000),
    batch=st.one_of(st.none(), st.integers(1, 50)),
    tick=st.sampled_from([1, 5, 64]),
    size=st.sampled_from([2, 16, 256]),
)
def test_bulk_random_schedule(
    dues: list[int],
    cancels: set[int],
    step: int,
    batch: int | None,
    tick: int,
    size: int,
) -> None:
    w: TimingWheel[int, None] = TimingWheel(start_ms=0, tick_ms=tick, wheel_size=size)
    for i, d in enumerate(dues):
        w.insert(i, d, None)
    live = {i: d for i, d in enumerate(dues) if i not in cancels}
    for i in cancels:
        assert w.cancel(i) == (i < len(dues))
    fired: list[tuple[int, int]] = []
    now = 0
    while len(fired) < len(live):
        out = w.advance(now, max_batch=batch)
        assert all(d <= now for d, _, _ in out)
        fired.extend((d, k) for d, k, _ in out)
        if not out or batch is None or len(out) < batch:
            now += step
    assert [d for d, _ in fired] == sorted(d for d, _ in fired)
    assert dict((k, d) for d, k in fired) == live
    assert len(w) == 0


# --------------------------------------------------------------------- values that know their due


class _Timer:
    """A value that knows its due and stands for its own key, as the node's entries do: it
    hashes and compares equal to its int key, so two timers of one key are the same key."""

    __slots__ = ("due", "key", "serial")

    def __init__(self, key: int, due: int, serial: int) -> None:
        self.key, self.due, self.serial = key, due, serial

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Timer):
            return self.key == other.key
        if isinstance(other, int):
            return self.key == other
        return NotImplemented


def _due_of(t: _Timer) -> int:
    return t.due


class _BareWheel:
    """A wheel given due_of, keyed by its values, seen through the interface of a wheel of
    (int key, int serial) so that the model machine checks it unchanged."""

    def __init__(self, **kw: int) -> None:
        self.w: TimingWheel[_Timer | int, _Timer] = TimingWheel(due_of=_due_of, **kw)

    def insert(self, key: int, due: int, serial: int) -> None:
        t = _Timer(key, due, serial)
        self.w.insert(t, due, t)

    def cancel(self, key: int) -> bool:
        return self.w.cancel(key)

    def advance(self, now: int, max_batch: int | None = None) -> list[tuple[int, int, int]]:
        out = []
        for due, key, value in self.w.advance(now, max_batch):
            assert key is value and isinstance(value, _Timer) and value.due == due
            out.append((due, value.key, value.serial))
        return out

    def get(self, key: int) -> tuple[int, int] | None:
        got = self.w.get(key)
        return None if got is None else (got[0], got[1].serial)

    def next_deadline(self) -> int | None:
        return self.w.next_deadline()

    def __len__(self) -> int:
        return len(self.w)

    def __contains__(self, key: object) -> bool:
        return key in self.w


class BareWheelMachine(WheelMachine):
    """The same model check for a wheel whose values know their due and are their keys."""

    def make_wheel(self, start: int, tick: int, size: int, chunk: int) -> TimingWheel[int, int]:
        return _BareWheel(  # type: ignore[return-value]
            start_ms=start, tick_ms=tick, wheel_size=size, cascade_chunk=chunk)


TestBareWheelMachine = BareWheelMachine.TestCase
TestBareWheelMachine.settings = settings(max_examples=300, stateful_step_count=60,
                                         deadline=None)


def test_a_timer_put_back_at_its_old_due_fires_once_with_its_new_value() -> None:
    w: TimingWheel[_Timer | int, _Timer] = TimingWheel(start_ms=0, due_of=_due_of)
    first = _Timer(1, 5_000, 1)
    w.insert(first, 5_000, first)
    assert w.cancel(1)
    second = _Timer(1, 5_000, 2)  # the same key, at the same instant: two keys in one bucket
    w.insert(second, 5_000, second)
    moved = _Timer(2, 5_000, 3)
    w.insert(moved, 5_000, moved)
    back = _Timer(2, 9_000, 4)  # moved away and back
    w.insert(back, 9_000, back)
    again = _Timer(2, 5_000, 5)
    w.insert(again, 5_000, again)
    fired = w.advance(10_000)
    assert [(d, v.key, v.serial) for d, _, v in fired] == [(5_000, 1, 2), (5_000, 2, 5)] or \
        [(d, v.key, v.serial) for d, _, v in fired] == [(5_000, 2, 5), (5_000, 1, 2)]
    assert len(w) == 0 and w.next_deadline() is None


def test_inserting_the_same_timer_again_adds_nothing() -> None:
    w: TimingWheel[_Timer | int, _Timer] = TimingWheel(start_ms=0, due_of=_due_of)
    t = _Timer(1, 5_000, 1)
    for _ in range(3):
        w.insert(t, 5_000, t)
    assert len(w) == 1 and w.held() == 1
    assert w.advance(5_000) == [(5_000, t, t)]


def test_a_value_must_carry_the_due_it_is_inserted_at() -> None:
    w: TimingWheel[_Timer | int, _Timer] = TimingWheel(start_ms=0, due_of=_due_of)
    t = _Timer(1, 5_000, 1)
    with pytest.raises(ValueError, match="due_ms 6000 is not the value's own due 5000"):
        w.insert(t, 6_000, t)
    assert len(w) == 0


@pytest.mark.parametrize("how", ["cancel-and-insert", "move"])
def test_leftovers_of_cancels_and_moves_are_swept(how: str) -> None:
    # A bucket keeps the key of a cancelled or moved timer until it is reached; a job edited
    # over and over, far ahead of its due, must not make the wheel grow without bound.
    w: TimingWheel[int, int] = TimingWheel(start_ms=0)
    live = 1_000
    for k in range(live):
        w.insert(k, 3_600_000 + k, 0)
    for rnd in range(1, 101):
        for k in range(live):
            if how == "cancel-and-insert":
                assert w.cancel(k)
            w.insert(k, 3_600_000 + (k * 7 + rnd * 13) % 1_800_000, rnd)
        assert len(w) == live
        # A sweep runs once leftovers may outnumber both the live timers and 4,096.
        assert w.held() <= live + 4096 + live, (rnd, w.held())
    fired = []
    while (deadline := w.next_deadline()) is not None:
        fired.extend(w.advance(deadline))
    assert sorted(k for _, k, _ in fired) == list(range(live))
    assert all(v == 100 for _, _, v in fired)

"""The lateness bound and paced catch-up (issue 28, item 3; node/lateness.py).

- An occurrence that cannot be published within its job's `max_lateness` (or the namespace's
  `max_lateness_ms`) after its scheduled instant is not published: it is counted in
  `chronowheel_occurrences_missed_total`, handed to the missed hook, and a recurring job goes on
  with its next occurrence, on time.
- Late occurrences (more than `catch_up_lag_ms` behind) go at most `catch_up_rate` a second per
  shard, while on-time ones go as they come due; each occurrence once, never early, also when
  the shard changes hands in the middle of a catch-up, and what comes due during such a gap
  (or a clock-skew block) is paced too.
- A queued late occurrence is not published yet: a cancel, a pause or an edit takes it out.
- A missed occurrence is recorded once, when the part covering it commits.

On the in-memory store and bus with a manual clock (tests/unit/node_rig.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from chronowheel.bus.memory import Message
from chronowheel.core import wire
from chronowheel.core.model import encode_control, encode_trigger
from chronowheel.core.shard import shard_of
from chronowheel.node.lateness import LateQueue, Missed, Pacer
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.pending import Pending, delivery
from chronowheel.node.service import Node
from chronowheel.node.state import ShardState

from tests.unit.node_rig import T0, NodeRig, scheduled_at
from tests.unit.test_node_clock_steps import SteppedClock, start_node

OUTAGE_MS = 10_000


def missed_total(node: Node) -> float:
    value: float = node.metrics.missed.labels("unit")._value.get()
    return value


def job_of(m: Message) -> str:
    return (m.key or b"").decode()


@pytest.fixture
def missed_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The log, with the lateness module's lines at INFO."""
    caplog.set_level(logging.INFO, logger="chronowheel.node.lateness")
    return caplog


def missed_lines(log: pytest.LogCaptureFixture) -> list[tuple[str, int, int]]:
    """(job id, scheduled ms, lateness ms) of each missed occurrence logged so far."""
    out = []
    for r in log.records:
        fields = vars(r)  # a log record's `extra` fields are its attributes
        if fields.get("outcome") == "missed":
            job_id, _, at = str(fields["occurrence"]).rpartition("@")
            assert job_id == fields["job_id"]
            out.append((job_id, int(at), int(fields["lateness_ms"])))
    return out


def last_record(rig: NodeRig, shard: int) -> wire.StateRecord:
    [*_, last] = [m for m in rig.bus.messages(rig.settings.state_topic)
                  if m.partition == shard and m.key == wire.StateRecord.key(shard)]
    assert last.value is not None
    return wire.StateRecord.parse(last.value, shard=shard)


def once_each_never_early(fired: list[Message]) -> None:
    keys = Counter(m.header(wire.OCCURRENCE) for m in fired)
    assert set(keys.values()) <= {1}, [k for k, n in keys.items() if n > 1]
    for m in fired:
        assert scheduled_at(m) <= m.committed_ms, "early"


# --- the bound -------------------------------------------------------------------------------

async def test_one_shots_due_in_an_outage_beyond_their_bound_are_missed_not_published(
        rig: NodeRig, missed_log: pytest.LogCaptureFixture) -> None:
    await rig.start()
    due = T0 + 2_000
    rig.upsert("bounded", at=due, max_lateness="3s")
    rig.upsert("bounded-long", at=due, max_lateness="1m")
    rig.upsert("unbounded", at=due)
    rig.upsert("after", at=T0 + 1_000 + OUTAGE_MS + 2_000, max_lateness="3s")
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(T0 + 1_000 + OUTAGE_MS)  # 9 s after their instant: over 3 s, under 1 min
    second = await rig.start("second")
    await rig.advance(200, step_ms=50)
    assert rig.fired("bounded") == []
    assert [scheduled_at(m) for m in rig.fired("bounded-long")] == [due]
    assert [scheduled_at(m) for m in rig.fired("unbounded")] == [due]
    assert missed_total(second) == 1
    # Logged with its lateness (the node reloaded the occurrence from its due row: the bound
    # travels there, in the row's headers).
    seen = missed_lines(missed_log)
    assert [(job, at) for job, at, _ in seen] == [("bounded", due)]
    assert seen[0][2] > 3_000
    await rig.advance_to(T0 + 1_000 + OUTAGE_MS + 2_100, step_ms=50)
    [after] = rig.fired("after")  # the next one of the same kind is on time
    assert scheduled_at(after) <= after.committed_ms < scheduled_at(after) + 200
    assert after.header(wire.MAX_LATENESS_MS) == b"3000"
    once_each_never_early(rig.fired())


async def test_a_paused_job_beyond_its_bound_misses_and_fires_its_next_on_time(
        rig: NodeRig, missed_log: pytest.LogCaptureFixture) -> None:
    # catch_up all would fire every withheld occurrence; the bound lets only those that are
    # at most 2.5 s late go, and the schedule continues after now.
    await rig.start()
    rig.upsert("tick", every="1s", start=T0 + 1_000, catch_up="all", max_lateness="2500ms")
    await rig.advance_to(T0 + 2_500, step_ms=50)
    assert [scheduled_at(m) for m in rig.fired("tick")] == [T0 + 1_000, T0 + 2_000]
    rig.submit("tick", encode_control("pause", "tick"))
    await rig.advance_to(T0 + 2_600, step_ms=50)
    await rig.advance_to(T0 + 12_600, step_ms=500)
    assert len(rig.fired("tick")) == 2
    node = rig.nodes[0]
    rig.submit("tick", encode_control("resume", "tick"))
    await rig.advance(200, step_ms=50)
    burst_msgs = rig.fired("tick")[2:]
    resumed = burst_msgs[0].committed_ms  # the instant the resumed occurrence was dispatched
    withheld = list(range(T0 + 3_000, resumed + 1, 1_000))
    assert len(withheld) == 10  # 3 s .. 12 s
    # The ones at most 2.5 s old at that instant fire; the older ones are missed.
    burst = [scheduled_at(m) for m in burst_msgs]
    assert burst == [at for at in withheld if resumed - at <= 2_500]
    assert len(burst) in (2, 3)
    seen = missed_lines(missed_log)
    assert sorted(at for _, at, _ in seen) == [at for at in withheld if resumed - at > 2_500]
    assert all(late_by > 2_500 for _, _, late_by in seen)
    assert missed_total(node) == len(seen) == len(withheld) - len(burst)
    await rig.advance_to(resumed + 5_100, step_ms=50)
    nexts = [m for m in rig.fired("tick") if scheduled_at(m) > resumed]
    first_next = withheld[-1] + 1_000
    assert [scheduled_at(m) for m in nexts] == list(range(first_next, first_next + 5_000, 1_000))
    for m in nexts:
        assert scheduled_at(m) <= m.committed_ms < scheduled_at(m) + 200
    once_each_never_early(rig.fired())


async def test_the_namespace_default_bounds_jobs_without_their_own() -> None:
    async with NodeRig(max_lateness_ms=3_000) as rig:
        await rig.start()
        rig.upsert("defaulted", at=T0 + 2_000)
        rig.upsert("own", at=T0 + 2_000, max_lateness="1m")
        rig.upsert("recurring", every="1s", start=T0 + 1_000)
        await rig.advance(500)
        await rig.stop_all()
        rig.clock.set(T0 + 1_000 + OUTAGE_MS)
        second = await rig.start("second")
        await rig.advance(200, step_ms=50)
        assert rig.fired("defaulted") == []
        assert len(rig.fired("own")) == 1
        # The recurring job's first withheld occurrence (1 s) is what coalesce fires within
        # the catch-up grace, but it is 10 s late: missed. The series goes on after now.
        assert rig.fired("recurring") == []
        assert missed_total(second) == 2  # "defaulted", and the recurring one
        await rig.advance(2_000, step_ms=50)
        assert [scheduled_at(m) for m in rig.fired("recurring")] == [T0 + 12_000, T0 + 13_000]


async def test_a_missed_occurrence_is_recorded_once_when_its_transaction_fails(
        rig: NodeRig, missed_log: pytest.LogCaptureFixture) -> None:
    # The part that takes a missed occurrence does not commit: the node renews its producer
    # and takes the shard again from its committed watermark, and takes the occurrence again.
    # It is recorded when a part that covers it commits: once.
    await rig.start()
    rig.upsert("bounded", at=T0 + 2_000, max_lateness="3s")
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(T0 + 1_000 + OUTAGE_MS)
    rig.bus.fail_commits = 1
    rig.bus.fail_commits_of = f"{rig.settings.namespace}-node-second"  # not its claims
    second = await rig.start("second")
    await rig.advance(3_000, step_ms=100)
    assert second.metrics.txn_failed._value.get() == 1
    assert second.transactions is not None and second.transactions.session == 1
    assert rig.fired("bounded") == []
    assert missed_total(second) == 1
    assert [(job, at) for job, at, _ in missed_lines(missed_log)] == [("bounded", T0 + 2_000)]


async def test_without_a_bound_nothing_is_missed(rig: NodeRig) -> None:
    assert rig.settings.max_lateness_ms == 0  # the default: no bound, as before
    await rig.start()
    for i in range(20):
        rig.upsert(f"old-{i}", at=T0 + 1_000 + i)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(T0 + 3_600_000)  # an hour later
    second = await rig.start("second")
    await rig.advance(200, step_ms=50)
    assert len(rig.fired()) == 20
    assert missed_total(second) == 0


async def test_triggered_occurrences_and_retries_have_no_bound(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("job", cron="0 0 1 1 *", max_lateness="1s")
    rig.submit("job", encode_trigger("job", "now-1"))
    await rig.advance(300, step_ms=50)
    assert [m.header(wire.TRIGGERED) for m in rig.fired("job")] == [b"now-1"]
    assert missed_total(rig.nodes[0]) == 0


# --- pacing ----------------------------------------------------------------------------------

RATE = 10


@pytest.fixture
async def paced() -> AsyncIterator[NodeRig]:
    async with NodeRig(catch_up_rate=RATE) as rig:
        yield rig


def late_jobs(rig: NodeRig, n: int, shard: int, due: int) -> list[str]:
    """n one-shot job ids on `shard`, all due at `due`, submitted."""
    ids: list[str] = []
    i = 0
    while len(ids) < n:
        job_id = f"late-{i}"
        i += 1
        if shard_of(job_id, rig.settings.shards) == shard:
            ids.append(job_id)
            rig.upsert(job_id, at=due + len(ids))  # a millisecond apart
    return ids


def on_shard(rig: NodeRig, prefix: str, shard: int) -> str:
    i = 0
    while shard_of(f"{prefix}-{i}", rig.settings.shards) != shard:
        i += 1
    return f"{prefix}-{i}"


async def test_late_occurrences_go_at_the_catch_up_rate_and_on_time_ones_first(
        paced: NodeRig) -> None:
    rig = paced
    await rig.start()
    late = late_jobs(rig, 60, 0, T0 + 2_000)
    back = T0 + 1_000 + OUTAGE_MS
    on_time = on_shard(rig, "on-time", 0)
    rig.upsert(on_time, at=back + 1_000)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(back)
    node = await rig.start("second")
    await rig.advance(1_050, step_ms=50)
    got = {job_of(m): m for m in rig.fired()}
    # The on-time one went at its instant, with most of the backlog still queued.
    m = got[on_time]
    assert scheduled_at(m) <= m.committed_ms < scheduled_at(m) + 200
    caught_up = [j for j in late if j in got]
    # A full bucket (one second's worth) at once, then RATE a second: about 2 * RATE by now.
    assert RATE <= len(caught_up) <= 2 * RATE + 1
    assert caught_up == late[:len(caught_up)]  # oldest first
    assert node.metrics.catch_up_queue.labels("0")._value.get() == 60 - len(caught_up)
    await rig.advance(2_000, step_ms=50)
    so_far = len([m for m in rig.fired() if job_of(m) in late])
    assert so_far <= len(caught_up) + 2 * RATE + 1
    await rig.advance(5_000, step_ms=50)
    assert sorted(job_of(m) for m in rig.fired() if job_of(m) in late) == sorted(late)
    once_each_never_early(rig.fired())
    await rig.advance(3_000, step_ms=100)  # caught up: the state record says all of it
    state = last_record(rig, 0)
    assert state.ahead is None and state.watermark >= rig.clock.now_ms() - 3_000


async def test_missed_occurrences_cost_no_catch_up_turn(
        paced: NodeRig, missed_log: pytest.LogCaptureFixture) -> None:
    rig = paced
    await rig.start()
    ids: list[str] = []
    i = 0
    while len(ids) < 50:
        job_id = f"m-{i}"
        i += 1
        if shard_of(job_id, rig.settings.shards) == 0:
            ids.append(job_id)
            rig.upsert(job_id, at=T0 + 2_000 + len(ids), max_lateness="2s")
    kept = late_jobs(rig, 5, 0, T0 + 3_000)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(T0 + 1_000 + OUTAGE_MS)
    node = await rig.start("second")
    await rig.advance(100, step_ms=50)
    # 50 missed in the first step, and the 5 behind them within the first token bucket.
    assert missed_total(node) == 50
    assert sorted(job_of(m) for m in rig.fired()) == sorted(kept)
    # Each is counted; the log names the first 20 of a step and sums up the rest in one line.
    assert len(missed_lines(missed_log)) == 20
    assert [r.getMessage() for r in missed_log.records if "more occurrences missed" in
            r.getMessage()] == ["shard 0: 30 more occurrences missed in this step (up to "
                                f"{OUTAGE_MS - 1_000 - 1} ms late); not published, counted in "
                                "chronowheel_occurrences_missed_total"]


async def test_a_takeover_in_the_middle_of_a_catch_up_publishes_each_once(
        paced: NodeRig) -> None:
    rig = paced
    await rig.start("first")
    late = late_jobs(rig, 60, 0, T0 + 2_000)
    back = T0 + 1_000 + OUTAGE_MS
    after = [on_shard(rig, f"after-{k}", 0) for k in range(3)]
    for k, job_id in enumerate(after):
        rig.upsert(job_id, at=back + 500 + 1_000 * k)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(back)
    await rig.start("catching-up")
    await rig.advance(1_500, step_ms=50)
    published = {job_of(m) for m in rig.fired()}
    assert after[0] in published and 0 < len(published & set(late)) < len(late)
    record = last_record(rig, 0)
    assert record.ahead is not None  # published past the cut while late ones wait
    [(cut, high)] = record.ahead
    assert record.watermark < cut < high
    # The node stops (gracefully: its release carries `ahead` too); the next owner reloads
    # the late rows that are left and nothing it published after the cut.
    await rig.stop_all()
    await rig.start("next")
    await rig.advance(8_000, step_ms=50)
    fired = rig.fired()
    once_each_never_early(fired)
    assert sorted(job_of(m) for m in fired if job_of(m) in late) == sorted(late)
    assert {job_of(m) for m in fired} >= set(after)


async def test_a_pause_of_a_queued_late_occurrence_holds_the_queue_until_it_is_stored(
        paced: NodeRig) -> None:
    # The pause finds the job's occurrence in the catch-up queue and waits for its store
    # writes (held here) while the pacer would reach it: the queue must not give it out
    # meanwhile (the paused row says it is withheld, so the resume would publish it again).
    rig = paced
    await rig.start("first")
    late = late_jobs(rig, 60, 0, T0 + 2_000)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(T0 + 1_000 + OUTAGE_MS)
    await rig.start("catching-up")
    await rig.advance(200, step_ms=50)
    paused = late[15]
    assert rig.fired(paused) == [] and rig.fired()  # still queued, the queue under way
    release = rig.hold_due_retires()
    rig.submit(paused, encode_control("pause", paused))
    await rig.advance(3_000, step_ms=50)  # the pacer would have reached it by now
    assert rig.fired(paused) == []
    release.set()
    await rig.advance(500, step_ms=50)
    assert rig.fired(paused) == []
    rig.submit(paused, encode_control("resume", paused))
    await rig.advance(8_000, step_ms=50)
    once_each_never_early(rig.fired())
    assert [scheduled_at(m) for m in rig.fired(paused)] == [T0 + 2_000 + 16]
    assert sorted(job_of(m) for m in rig.fired()) == sorted(late)


@pytest.mark.parametrize("handover", [False, True])
async def test_a_cancel_a_pause_and_an_edit_take_queued_late_occurrences_out(
        paced: NodeRig, handover: bool) -> None:
    # Late occurrences waiting in the catch-up queue are not published yet: a cancel, a pause
    # and an edit treat them as they treat an entry of the wheel (the entry goes, its due row
    # too, so a next owner does not load it back into its queue).
    rig = paced
    await rig.start("first")
    late = late_jobs(rig, 60, 0, T0 + 2_000)
    tick = on_shard(rig, "tick", 0)
    rig.upsert(tick, every="1h", start=T0 + 2_100)  # its first occurrence queued, last
    back = T0 + 1_000 + OUTAGE_MS
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(back)
    await rig.start("catching-up")
    await rig.advance(200, step_ms=50)
    cancelled, edited = late[-2], late[-1]
    published = {job_of(m) for m in rig.fired()}
    assert published and not published & {cancelled, edited, tick}  # still queued
    rig.cancel(cancelled)
    rig.submit(tick, encode_control("pause", tick))
    moved_to = rig.clock.now_ms() + 3_000
    rig.upsert(edited, at=moved_to)
    await rig.advance(200, step_ms=50)
    if handover:  # the next owner loads the queue's rows again from the state record
        await rig.stop_all()
        await rig.start("next")
    await rig.advance(10_000, step_ms=50)
    fired = rig.fired()
    once_each_never_early(fired)
    assert rig.fired(cancelled) == []
    assert rig.fired(tick) == []
    assert [scheduled_at(m) for m in rig.fired(edited)] == [moved_to]
    assert sorted(job_of(m) for m in fired if job_of(m) in late[:-2]) == sorted(late[:-2])
    rig.submit(tick, encode_control("resume", tick))  # the paused occurrence was withheld
    await rig.advance(300, step_ms=50)
    assert [scheduled_at(m) for m in rig.fired(tick)] == [T0 + 2_100]


async def test_a_takeover_from_a_record_with_ahead_paces_what_came_due_since(
        paced: NodeRig) -> None:
    # A node catching up stops with late ones still queued; the shard is then owned by nobody
    # for a while, and what came due meanwhile, after the record's published range, is late
    # too: the next owner queues it behind the rows it loads back (a second range in the
    # state record), not all at once. A third owner takes over from that record.
    rig = paced
    await rig.start("first")
    late = late_jobs(rig, 80, 0, T0 + 2_000)
    back = T0 + 1_000 + OUTAGE_MS
    wave: list[str] = []  # due after the catching-up node stopped, before the next owner
    i = 0
    while len(wave) < 40:
        job_id = f"wave-{i}"
        i += 1
        if shard_of(job_id, rig.settings.shards) == 0:
            wave.append(job_id)
            rig.upsert(job_id, at=back + 3_000 + 100 * len(wave))
    second_back = back + 2_000 + OUTAGE_MS
    on_time = on_shard(rig, "on-time", 0)
    rig.upsert(on_time, at=second_back + 800)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(back)
    await rig.start("catching-up")
    await rig.advance(1_500, step_ms=50)
    await rig.stop_all()  # its release names its published range
    [(_cut, high)] = last_record(rig, 0).ahead or [(0, 0)]
    assert high < back + 3_000 and not {job_of(m) for m in rig.fired()} & set(wave)
    waiting = len([j for j in late if not rig.fired(j)])
    assert waiting > 2 * RATE + 1
    rig.clock.set(second_back)  # the wave is 5.1 to 9 s late: more than catch_up_lag_ms
    await rig.start("next")
    await rig.advance(1_000, step_ms=50)
    # About 2 * RATE in the first second (a full bucket, then the rate), the oldest first:
    # the wave waits behind the late ones loaded back.
    since = [m for m in rig.fired() if m.committed_ms >= second_back and job_of(m) != on_time]
    assert RATE <= len(since) <= 2 * RATE + 1
    assert all(job_of(m) in late for m in since[:waiting])
    m = rig.fired(on_time)[0]  # on-time work goes first
    assert scheduled_at(m) <= m.committed_ms < scheduled_at(m) + 200
    ranges = last_record(rig, 0).ahead
    assert ranges is not None and len(ranges) == 2
    await rig.stop_all()
    await rig.start("third")
    await rig.advance(12_000, step_ms=50)
    fired = rig.fired()
    once_each_never_early(fired)
    assert sorted(job_of(m) for m in fired if job_of(m) in late + wave) == sorted(late + wave)
    await rig.advance(3_000, step_ms=100)
    assert last_record(rig, 0).ahead is None  # caught up


async def test_a_clock_skew_block_in_the_middle_of_a_catch_up_paces_what_came_due_meanwhile(
        ) -> None:
    # The node catching up has its clock stepped 20 s forward: dispatch stops. What comes due
    # while it is blocked is late when the clock agrees again, and goes through the pacer
    # behind the late ones still waiting, not at once.
    async with NodeRig(shards=1, catch_up_rate=RATE) as rig:
        await rig.start("first")
        late = late_jobs(rig, 60, 0, T0 + 2_000)
        back = T0 + 1_000 + OUTAGE_MS
        wave = [f"wave-{i}" for i in range(40)]
        for i, job_id in enumerate(wave):
            rig.upsert(job_id, at=back + 1_500 + 50 * i)
        await rig.advance(500)
        await rig.stop_all()
        rig.clock.set(back)
        clock = SteppedClock(rig.clock)
        node = await start_node(rig, clock)
        await rig.advance(1_000, step_ms=50)
        assert not {job_of(m) for m in rig.fired()} & set(wave)
        clock.step(20_000)
        for o in node.owned.values():
            o.actor.wake.set()
        await rig.settle()
        assert node.blocked
        await rig.advance_to(back + 10_000, step_ms=100)  # the wave: 6.5 to 8.5 s late
        waiting = len(late) - len([m for m in rig.fired() if job_of(m) in late])
        clock.step(-20_000)
        node.clock_guard.recheck.set()
        await rig.settle()
        unblocked = rig.clock.now_ms()
        await rig.advance(1_000, step_ms=50)
        assert not node.blocked
        since = [m for m in rig.fired() if m.committed_ms >= unblocked]
        assert RATE <= len(since) <= 2 * RATE + 1  # paced, the oldest first
        assert all(job_of(m) in late for m in since[:waiting])
        await rig.advance(12_000, step_ms=100)
        fired = rig.fired()
        once_each_never_early(fired)
        assert sorted(job_of(m) for m in fired) == sorted(late + wave)


async def test_a_backlog_over_the_memory_cap_goes_unpaced_each_once() -> None:
    # 45 late one-shots, 15 of them on one millisecond, with room for 20 rows: the loader
    # stops at the cap, inside that millisecond too, reads it again, and waits for room.
    # Paced, the backlog beyond the cap would hold on-time work behind it; it goes as a herd
    # does. (More rows on one millisecond than the cap is a known limit: test_node.py.)
    async with NodeRig(catch_up_rate=RATE, bucket_cap_rows=20, bucket_page_rows=7) as rig:
        await rig.start("first")
        late = late_jobs(rig, 30, 0, T0 + 2_000)
        same_ms = [j for j in (f"same-{i}" for i in range(200))
                   if shard_of(j, rig.settings.shards) == 0][:15]
        assert len(same_ms) == 15
        for job_id in same_ms:
            rig.upsert(job_id, at=T0 + 3_000)
        back = T0 + 1_000 + OUTAGE_MS
        on_time = on_shard(rig, "on-time", 0)
        rig.upsert(on_time, at=back + 1_000)
        await rig.advance(500)
        await rig.stop_all()
        rig.clock.set(back)
        await rig.start("second")
        await rig.advance(1_100, step_ms=50)
        fired = rig.fired()
        once_each_never_early(fired)
        # All 45 in about a second: paced at RATE they would take four and a half.
        assert sorted(job_of(m) for m in fired if job_of(m) != on_time) == sorted(late + same_ms)
        m = next(m for m in fired if job_of(m) == on_time)
        assert scheduled_at(m) <= m.committed_ms < scheduled_at(m) + 200


async def test_a_failover_in_the_middle_of_a_catch_up_publishes_each_once(
        paced: NodeRig) -> None:
    # The catching-up node pauses with a transaction open; another node fences it and takes
    # the shard over from its last committed record (with its `ahead` range).
    rig = paced
    await rig.start("first")
    late = late_jobs(rig, 60, 0, T0 + 2_000)
    back = T0 + 1_000 + OUTAGE_MS
    after = on_shard(rig, "after", 0)
    rig.upsert(after, at=back + 3_000)
    await rig.advance(500)
    await rig.stop_all()
    rig.clock.set(back)
    await rig.start("paused")
    await rig.advance(1_200, step_ms=50)
    hold = rig.bus.hold_commits(f"{rig.settings.namespace}-node-paused")
    await rig.advance(300, step_ms=50)
    await rig.start("second")
    await rig.advance(8_000, step_ms=50)
    hold.set()
    await rig.settle()
    await rig.advance(500, step_ms=50)
    fired = rig.fired()
    once_each_never_early(fired)
    assert sorted(job_of(m) for m in fired if job_of(m) in late) == sorted(late)
    [m] = [m for m in fired if job_of(m) == after]
    assert scheduled_at(m) <= m.committed_ms < scheduled_at(m) + 300


async def test_a_shard_that_falls_behind_while_it_runs_is_not_paced(paced: NodeRig) -> None:
    # No takeover, no clock-skew block: the node was busy (its loop held) for 8 s. That is lag,
    # not a gap, and the shard publishes everything due, in order, at once.
    rig = paced
    node = await rig.start()
    late = late_jobs(rig, 60, 0, T0 + 2_000)
    await rig.advance(1_500)
    rig.clock.set(T0 + 10_000)
    await rig.settle()
    assert sorted(job_of(m) for m in rig.fired()) == sorted(late)
    assert node.metrics.catch_up_queue.labels("0")._value.get() == 0


async def test_rate_zero_publishes_every_late_occurrence_at_once() -> None:
    async with NodeRig(catch_up_rate=0) as rig:
        await rig.start()
        late = late_jobs(rig, 60, 0, T0 + 2_000)
        await rig.advance(500)
        await rig.stop_all()
        rig.clock.set(T0 + 1_000 + OUTAGE_MS)
        await rig.start("second")
        await rig.advance(100, step_ms=50)
        assert sorted(job_of(m) for m in rig.fired()) == sorted(late)


# --- the parts -------------------------------------------------------------------------------

def entry(job_id: str, slot: int, bound: int | None = None) -> Pending:
    headers = () if bound is None else ((wire.MAX_LATENESS_MS, str(bound)),)
    return Pending(job_id=job_id, scheduled_ms=slot, payload=b"",
                   delivery=delivery("t", 1, headers, 5, 10_000))


def test_the_queue_gives_oldest_first_and_finishes_a_millisecond() -> None:
    q = LateQueue()
    for job_id, slot in (("c", 30), ("a", 10), ("b", 10), ("d", 40)):
        q.push(entry(job_id, slot))
    taken = q.pop(1, lambda p: False)
    assert sorted(p.job_id for p in taken) == ["a", "b"]  # both of 10 ms, over the budget
    assert q.oldest() == 30 and len(q) == 2
    assert [p.job_id for p in q.pop(5, lambda p: False)] == ["c", "d"]
    assert q.oldest() is None


def test_an_occurrence_queued_twice_is_given_once() -> None:
    # The loader reads a millisecond again after stopping inside it at the memory cap.
    q = LateQueue()
    q.push(entry("a", 10))
    q.push(entry("b", 10))
    q.push(entry("a", 10))
    assert len(q) == 2
    assert sorted(p.job_id for p in q.pop(5, lambda p: False)) == ["a", "b"]
    q.push(entry("a", 10))  # taken out since: queued again is a new turn
    assert len(q) == 1


def test_free_entries_cost_no_budget() -> None:
    q = LateQueue()
    for i in range(5):
        q.push(entry(f"free-{i}", i))
    q.push(entry("paid", 10))
    q.push(entry("waits", 20))
    taken = q.pop(1, lambda p: p.job_id.startswith("free"))
    assert [p.job_id for p in taken] == [*(f"free-{i}" for i in range(5)), "paid"]
    assert len(q) == 1


def test_the_bound_is_read_once_per_delivery() -> None:
    assert entry("x", 1, 2_500).delivery.max_lateness_ms == 2_500
    assert entry("x", 1).delivery.max_lateness_ms is None


def test_the_pacer_refills_at_its_rate_up_to_one_second() -> None:
    pacer = Pacer(10, 0)
    assert pacer.available(0) == 10
    pacer.spend(10)
    assert pacer.available(0) == 0
    assert pacer.available(350) == 3
    assert pacer.available(60_000) == 10  # never more than a second's worth
    pacer.spend(12)  # a finished millisecond may overdraw: paid back before the next
    assert pacer.available(60_000) == 0
    assert pacer.available(60_300) == 1


def test_missed_counts_logs_and_tells_its_sink_which_may_fail_alone(
        missed_log: pytest.LogCaptureFixture) -> None:
    metrics = NodeMetrics()
    told: list[tuple[str, int, int]] = []
    missed = Missed(shard=3, namespace="acme", metrics=metrics,
                    sink=lambda p, late_by: told.append((p.job_id, p.scheduled_ms, late_by)))
    missed.record(entry("a", 1_000, 2_000), 5_000, 2_000)
    assert told == [("a", 1_000, 5_000)]
    assert missed_lines(missed_log) == [("a", 1_000, 5_000)]

    def broken(p: Pending, late_by: int) -> None:
        raise RuntimeError("the recorder is down")

    missed.sink = broken
    missed.record(entry("b", 1_000, 2_000), 3_000, 2_000)  # does not raise
    assert metrics.missed.labels("acme")._value.get() == 2


def test_the_record_names_each_published_range_until_the_watermark_covers_it() -> None:
    # A shard taken over from a record with one range, (200, 300], that cut again at 400 and
    # has published up to 450 since: the late rows of (100, 200] and (300, 400] go through
    # its queue, the others are published.
    state = ShardState(shard=0, start_ms=0, tick_ms=10, ingest_slack_ms=50)
    state.behind_from, state.late_cut, state.watermark, state.horizon_ms = 100, 200, 300, 100
    assert state.record_watermark() == (100, ((200, 300),))  # nothing loaded back yet
    assert state.late_range(150) and not state.late_range(250)
    state.ahead, state.late_cut, state.watermark, state.horizon_ms = [(200, 300)], 400, 450, 460
    assert [s for s in (100, 150, 200, 250, 300, 350, 400, 420) if state.late_range(s)] == [
        150, 200, 350, 400]
    assert state.unpublished(350, ("x", 350, 1)) is False  # not queued: taken already
    state.late.push(entry("x", 350))
    assert state.unpublished(350, ("x", 350, 1)) and not state.unpublished(250, ("y", 250, 1))
    state.late.push(entry("a", 150))
    assert state.record_watermark() == (149, ((200, 300), (400, 450)))
    state.late.remove(("a", 150, 1))  # (100, 200] drained: the watermark covers (200, 300]
    assert state.record_watermark() == (349, ((400, 450),))
    state.late.remove(("x", 350, 1))
    assert state.record_watermark() == (450, None)
    state.horizon_ms = 320  # (300, 400] not all loaded: its rows from 321 on still wait
    assert state.record_watermark() == (320, ((400, 450),))


def test_the_queue_gives_nothing_past_the_loaded_horizon() -> None:
    q = LateQueue()
    for job_id, slot in (("a", 10), ("b", 20), ("c", 20)):
        q.push(entry(job_id, slot))
    assert [p.job_id for p in q.pop(5, lambda p: False, upto=19)] == ["a"]
    assert sorted(p.job_id for p in q.pop(5, lambda p: False, upto=20)) == ["b", "c"]


async def test_a_one_shot_submitted_further_in_the_past_than_its_bound_is_missed_at_once(
        rig: NodeRig) -> None:
    node = await rig.start()
    rig.upsert("too-old", at=T0 - 10_000, max_lateness="5s")
    rig.upsert("old-enough", at=T0 - 2_000, max_lateness="5s")
    await rig.advance(300, step_ms=50)
    assert [job_of(m) for m in rig.fired()] == ["old-enough"]
    assert missed_total(node) == 1


async def test_an_invalid_bound_goes_to_rejected_with_the_field_and_the_limit(
        rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("too-tight", at=T0 + 5_000, max_lateness="500ms")
    rig.upsert("in-window", every="1h", window="10m", max_lateness="5m")
    await rig.advance(300, step_ms=50)
    reasons = {job_of(m): (m.header(wire.REASON) or b"").decode()
               for m in rig.bus.messages(rig.settings.rejected_topic)}
    assert reasons["too-tight"].startswith(
        "job.max_lateness: must be between 1s and 3653d (limits.MIN_MAX_LATENESS_MS")
    assert reasons["in-window"].startswith("job.max_lateness: must be longer than window (10m)")
    await rig.advance(5_000)
    assert rig.fired() == []

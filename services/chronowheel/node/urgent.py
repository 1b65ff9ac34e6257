"""The urgent lane: one-shots due soon, applied ahead of their shard's backlog.

A shard applies its submit commands in offset order, one ingest step at a time. Behind a herd
(a bulk import, a burst of jobs due next month) a one-shot due two seconds after it was sent
would wait for every command before it: 100,000 commands over 16 shards at 3,000 a second are
half a minute. So every record is looked at once, when it first arrives (`arrived`), and a new
job due within `urgent_ms` is taken out of turn by the lane's own task (`take`) when nothing
before it that is still unapplied concerns the same job.

How far ahead: the records a shard holds (its queue, up to `pump_pause_rows`) and, past them, a
**look-ahead** of up to `urgent_lookahead_records` offsets that are read from Kafka, looked at
and dropped (only their keys are kept, and the urgent ones): the partition is sought back to
where the queue ended once the queue has drained to `pump_resume_rows`, and forward again past
what was looked at once the queue is full again, so nothing is read twice for nothing and
memory stays bounded. A command further behind waits for the in-order pass to come within that
distance.

Why the guarantees hold:

- **Per-job order.** A record is taken out of turn only if no unapplied record before it has
  its key (`waiting` counts the keys of every record looked at, not taken by the lane and not
  yet applied in order; a record with no key blocks all). Records after it with the same key
  are applied after it: the lane takes its records in offset order; it leaves alone a key the
  in-order step is applying; and an in-order step that reaches a record the lane has in flight
  waits for the lane's batch before applying anything.
- **Offsets.** The committed submit offset stays the end of the prefix applied in order. The
  in-order pass skips a record the lane applied. A takeover in between applies it again from
  the committed offset: an upsert identical to the stored row changes nothing (`unchanged`),
  also after its one-shot fired (the row is kept `retention` past its occurrence), so it
  neither fires twice nor changes anything.
- **Messages about it** (a quarantine) are held until the in-order pass has gone past every
  record of the lane batch they came from, and go out with the offsets that cover them, once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import orjson

from chronowheel.bus.ports import SubmitRecord
from chronowheel.core.model import Upsert, ValidationPolicy, instant_ms, parse_command
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.node.state import Outgoing


@dataclass(slots=True)
class LaneBatch:
    """Records the lane applies together, in offset order."""

    records: list[tuple[SubmitRecord, Upsert]]


class UrgentLane:
    """Which records of one shard go out of turn, and where its partition is read (pure)."""

    def __init__(self, *, shard: int, shards: int, policy: ValidationPolicy, urgent_ms: int,
                 lookahead: int, queue_rows: int, resume_rows: int) -> None:
        self.shard = shard
        self.shards = shards
        self.policy = policy
        self.urgent_ms = urgent_ms
        self.lookahead = lookahead
        self.queue_rows = queue_rows
        self.resume_rows = resume_rows
        self.reset()

    @property
    def enabled(self) -> bool:
        return self.urgent_ms > 0

    def reset(self) -> None:
        """After a takeover: the partition is read again from the committed offset."""
        self.looked_to: int | None = None
        """Records below this offset were looked at (`arrived`) already."""
        self.waiting: Counter[bytes | None] = Counter()
        """Keys of the records looked at that wait for the in-order pass (not the lane's)."""
        self.ready: dict[int, tuple[SubmitRecord, Upsert]] = {}
        """Offset -> an urgent record the lane may take, in offset order."""
        self.in_flight: set[int] = set()
        """Offsets of the lane batch being applied."""
        self.applied: set[int] = set()
        """Offsets the lane applied that the in-order pass has not reached yet."""
        self.held: list[tuple[int, Outgoing]] = []
        """(offset of the record it is about, a message the lane produced): released once
        the in-order pass has gone past that record."""
        self.stepping: Counter[bytes | None] = Counter()
        """Keys of the records the in-order step now applies (the lane leaves them alone)."""
        self.skip_from: int | None = None
        """While the queue is full: the first offset not queued. Records from here on are
        looked at and dropped, and read again after a seek back here."""
        self.seek_to: int | None = None
        """A seek the lane task is to make (None: none pending)."""
        self.behind = False
        """The look-ahead began at a record looked at before: the partition is read below
        what was looked at, which would be read for nothing, so it is not read on..."""
        self.forward = False
        """...unless a seek past what was looked at is to be made (the look-ahead is then
        short enough to be read on)."""
        self.seeking_forward = False
        """The pending seek is that one (once made, the partition is read on from there)."""

    # --- records arriving ----------------------------------------------------------------
    def arrived(self, rec: SubmitRecord, queued: int, now_ms: int) -> bool:
        """Look at a record handed over by the pump (offset order); whether to queue it for
        the in-order pass (False: it lies in the look-ahead and is read again later)."""
        offset = rec.offset
        if self.seek_to is not None:
            return False  # read again from the seek's offset
        if self.looked_to is None or offset >= self.looked_to:
            self.looked_to = offset + 1
            # The lane holds at most as many records as the queue (memory stays bounded when
            # a whole herd is due soon: the rest waits for the in-order pass).
            cmd = self._urgent(rec, now_ms) \
                if self.enabled and len(self.ready) < self.queue_rows else None
            if cmd is not None and self.waiting[None] == 0 and self.waiting[rec.key] == 0:
                self.ready[offset] = (rec, cmd)
            else:
                self.waiting[rec.key] += 1
        elif self.skip_from is not None:
            return False  # looked at before, and still beyond the queue
        if self.skip_from is not None:
            return False
        if self.lookahead > 0 and self.enabled and queued >= self.queue_rows:
            self.skip_from = offset
            ahead = self.looked_to - offset
            self.behind = ahead > 1
            self.forward = self.behind and ahead < self.lookahead // 2
            return False
        return True

    def _urgent(self, rec: SubmitRecord, now_ms: int) -> Upsert | None:
        """The record's upsert if it is one of a one-shot of this shard (a new job or an edit)
        due within `urgent_ms`, with no calendar (cheap checks first: most records of a herd
        are not)."""
        value = rec.value
        if not value or rec.key is None:
            return None
        try:
            doc = orjson.loads(value)
        except Exception:
            return None
        if type(doc) is not dict or doc.get("op") != "upsert":
            return None
        job = doc.get("job")
        if type(job) is not dict or "at" not in job or "calendar" in job:
            return None
        try:
            if instant_ms(job["at"], "job.at") > now_ms + self.urgent_ms:
                return None
            cmd = parse_command(value, key=rec.key, policy=self.policy, now_ms=now_ms)
        except ValidationError:
            return None  # refused in order, with its reason
        except Exception:  # a parser bug must not stop the pump: in order, it is quarantined
            return None
        if not isinstance(cmd, Upsert) or shard_of(cmd.job.id, self.shards) != self.shard:
            return None
        return cmd

    # --- where the partition is read -------------------------------------------------------
    def fetch_wanted(self, queued: int, paused: bool) -> bool:
        """Whether the pump should fetch the shard now (False: pause it)."""
        if self.seek_to is not None or self.behind:
            return False  # only records looked at before would come
        if self.skip_from is not None:
            ahead = (self.looked_to or self.skip_from) - self.skip_from
            return ahead < (self.lookahead // 2 if paused else self.lookahead)
        return queued < self.resume_rows if paused else queued <= self.queue_rows

    def plan_seek(self, queued: int) -> int | None:
        """A seek to make now, if any: back to the end of the queue once it has drained, or
        forward past what was looked at already once the queue is full."""
        if self.seek_to is not None or self.skip_from is None:
            return None
        if queued < self.resume_rows:
            self.seek_to = self.skip_from
            self.skip_from = None
            self.behind = self.forward = self.seeking_forward = False
        elif self.forward:
            self.seek_to = self.looked_to
            self.forward = False
            self.seeking_forward = True
        return self.seek_to

    def sought(self) -> None:
        """The pending seek is made: records come from its offset on."""
        if self.seeking_forward:
            self.behind = self.seeking_forward = False
        self.seek_to = None

    # --- the lane ----------------------------------------------------------------------
    def take(self, most: int) -> LaneBatch | None:
        """The next lane batch (offset order; keys the in-order step is applying are left)."""
        taken: list[tuple[SubmitRecord, Upsert]] = []
        blocked: set[bytes | None] = set()
        for offset, (rec, cmd) in list(self.ready.items()):
            if len(taken) >= most:
                break
            if rec.key in blocked or self.stepping[rec.key] or self.stepping[None]:
                blocked.add(rec.key)  # and every later record of the key
                continue
            del self.ready[offset]
            self.in_flight.add(offset)
            taken.append((rec, cmd))
        return LaneBatch(taken) if taken else None

    def finished(self, batch: LaneBatch, messages: list[tuple[int, Outgoing]]) -> None:
        """The lane applied `batch`; `messages`: (offset of the record it is about, message)."""
        for rec, _cmd in batch.records:
            self.in_flight.discard(rec.offset)
            self.applied.add(rec.offset)
        self.held.extend(messages)

    # --- the in-order pass -------------------------------------------------------------------
    def in_order(self, rec: SubmitRecord) -> bool:
        """The in-order step reached `rec`; whether it applies it (False: the lane did, or
        is doing so)."""
        offset = rec.offset
        if offset in self.applied:
            self.applied.discard(offset)
            return False
        if offset in self.in_flight:
            return False
        if self.ready.pop(offset, None) is not None:
            self.waiting[rec.key] += 1  # applied in order after all: counted until done
        self.stepping[rec.key] += 1
        return True

    def stepped(self, applied: list[SubmitRecord], through: int) -> list[Outgoing]:
        """The in-order step applied `applied` and passed every offset up to `through`: its
        keys wait no more; the messages of lane batches it has gone past."""
        for rec in applied:
            key = rec.key
            self.stepping[key] -= 1
            if not self.stepping[key]:
                del self.stepping[key]
            left = self.waiting[key] - 1
            if left > 0:
                self.waiting[key] = left
            else:
                self.waiting.pop(key, None)
        if self.applied:
            self.applied = {offset for offset in self.applied if offset > through}
        if not self.held:
            return []
        out = [msg for offset, msg in self.held if offset <= through]
        if out:
            self.held = [(offset, msg) for offset, msg in self.held if offset > through]
        return out

    def waits_for_lane(self, records: list[SubmitRecord]) -> bool:
        """Whether an in-order step over `records` must first let the lane batch in flight
        end (it reaches one of its records, so later records of its jobs follow it)."""
        return bool(self.in_flight) and any(r.offset in self.in_flight for r in records)

"""The console's pure parts: authentication and CSRF rules, the bind check, the heat map's
arithmetic, cursors, and the escaping of everything a page shows."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import unquote

import orjson
import pytest
from chronowheel.console.actions import JOB_ACTIONS
from chronowheel.console.app import Guard, check_bind, is_loopback
from chronowheel.console.pages import confirm_page, heat_page, job_page, tail_page
from chronowheel.console.sources import HeatMap, JobView, make_cursor, parse_cursor
from chronowheel.core import wire
from chronowheel.core.buckets import MINUTE_MS
from chronowheel.core.model import ValidationPolicy
from chronowheel.core.wire import StateRecord
from chronowheel.errors import ChronowheelError, ConfigError
from chronowheel.node.publisher import state_record
from chronowheel.node.state import ShardState
from chronowheel.ops.tail import TailMessage, message_json
from chronowheel.settings import Secret, Settings
from chronowheel.store.base import DueRow, JobRow
from chronowheel.store.memory import MemoryStore

T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z


class FakeRequest:
    """Only what Guard reads of an aiohttp request: its headers."""

    def __init__(self, authorization: str | None) -> None:
        self.headers = {} if authorization is None else {"Authorization": authorization}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_guard_accepts_the_token_as_bearer_or_basic_password_only() -> None:
    guard = Guard.create(Secret("tok-123"), "127.0.0.1")
    ok = ["Bearer tok-123", basic("ops", "tok-123"), basic("", "tok-123")]
    bad = [None, "", "Bearer", "Bearer tok-12", "Bearer tok-1234", basic("tok-123", ""),
           basic("ops", "nope"), "Basic !!!notbase64", "Token tok-123"]
    for header in ok:
        assert guard.authenticated(FakeRequest(header)), header
    for header in bad:
        assert not guard.authenticated(FakeRequest(header)), header


def test_without_a_token_nothing_authenticates() -> None:
    guard = Guard.create(None, "127.0.0.1")
    assert not guard.authenticated(FakeRequest("Bearer ")), "empty"
    assert not guard.authenticated(FakeRequest(basic("a", "b")))


def test_csrf_token_is_bound_to_cookie_action_and_job() -> None:
    guard = Guard.create(Secret("t"), "127.0.0.1")
    token = guard.csrf_token("cookie-a", "cancel", "job-1")
    assert guard.csrf_ok("cookie-a", token, "cancel", "job-1")
    assert not guard.csrf_ok("cookie-b", token, "cancel", "job-1")
    assert not guard.csrf_ok("cookie-a", token, "cancel", "job-2")
    assert not guard.csrf_ok("cookie-a", token, "pause", "job-1")
    assert not guard.csrf_ok(None, token, "cancel", "job-1")
    assert not guard.csrf_ok("cookie-a", "", "cancel", "job-1")
    # another console process (another key) does not accept it
    assert not Guard.create(Secret("t"), "127.0.0.1").csrf_ok("cookie-a", token, "cancel",
                                                              "job-1")


def test_bind_beyond_loopback_needs_a_token() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "10.1.2.3", "::", "console.example"):
        assert not is_loopback(host)
        with pytest.raises(ConfigError, match="CHRONOWHEEL_CONSOLE_TOKEN"):
            check_bind(host, None)
        check_bind(host, Secret("t"))


def test_console_token_is_a_secret_from_the_environment() -> None:
    s = Settings.from_env({"CHRONOWHEEL_CONSOLE_TOKEN": "abc"})
    assert isinstance(s.console_token, Secret) and s.console_token.reveal() == "abc"
    assert "abc" not in repr(s) and s.safe_view()["console_token"] == "(set)"


def test_heat_map_totals_busiest_and_hours() -> None:
    first = T0 + 58 * MINUTE_MS  # 00:58: the window crosses into the next hour
    hm = HeatMap(first, 4, ((1, 0, 7, 0), (2, 0, 9, 3)))
    assert hm.total == 22
    assert hm.minute_totals() == [3, 0, 16, 3]
    assert hm.busiest(3) == [(first + 2 * MINUTE_MS, 16), (first, 3),
                             (first + 3 * MINUTE_MS, 3)]
    hour = 3_600_000
    assert hm.hour_totals() == [(T0, 3), (T0 + hour, 19)]


def test_cursor_round_trip_keeps_ids_with_colons() -> None:
    row = DueRow(T0, 3, T0 + 5, "a:b:c", 2, T0, 1, "t", b"", (), None)
    assert parse_cursor(make_cursor(row)) == (3, T0 + 5, "a:b:c", 2)
    with pytest.raises(ValueError):
        parse_cursor("nonsense")


def test_state_record_carries_the_node_clock_and_parses_back() -> None:
    state = ShardState(shard=2, start_ms=T0, tick_ms=100, ingest_slack_ms=0)
    raw = state_record(shard=2, watermark=T0, state=state, node_id="n1", owner="o", at=T0 + 1,
                       clock=(-7, False))
    rec = StateRecord.parse(raw, shard=2)
    assert (rec.skew_ms, rec.blocked, rec.node, rec.at) == (-7, False, "n1", T0 + 1)
    assert (rec.owner, rec.wheel) == ("o", 0)
    old = StateRecord.parse(orjson.dumps({"watermark": T0}), shard=2)
    assert (old.skew_ms, old.blocked) == (None, None)


HOSTILE = '<script>alert("x")</script>'


def test_pages_escape_what_they_show() -> None:
    row = JobRow(HOSTILE, 0, orjson.dumps({"id": HOSTILE, "payload": HOSTILE}), 1,
                 "scheduled", T0, T0)
    view = JobView(row, {"id": HOSTILE}, "UTC", (T0,), None, None, None, (), 0, HOSTILE)
    html = job_page(view, namespace="ns", nonce="n", now_ms=T0,
                    actions=list(JOB_ACTIONS.values()))
    confirm = confirm_page(JOB_ACTIONS["cancel"], HOSTILE, namespace="ns", nonce="n",
                           csrf="c")
    tail = tail_page(topic="ns.rejected", messages=[{
        "topic": "ns.rejected", "partition": 0, "offset": 1, "timestamp_ms": T0,
        "key": HOSTILE, "headers": {"cw-reason": HOSTILE}, "payload": HOSTILE}],
        reason_header="cw-reason", active="rejected", title="Rejected", namespace="ns",
        nonce="n", now_ms=T0)
    for text in (html, confirm, tail):
        assert HOSTILE not in text
        assert "&lt;script&gt;" in text
        # the only scripts are the page's own, with the nonce
        assert text.count("<script") == text.count('<script nonce="n"') + \
            text.count('<script type="application/json"')


def test_heat_map_data_cannot_close_its_script_element() -> None:
    hm = HeatMap(T0, 2, ((1, 2),))
    html = heat_page(hm, namespace="ns</script><script>x()</script>", nonce="n", now_ms=T0,
                     elapsed_ms=1.0)
    assert "</script><script>x()" not in html
    data = html.split('id="heat-data">', 1)[1].split("</script>", 1)[0]
    assert orjson.loads(data)["counts"] == [[1, 2]]


def test_cancel_is_not_offered_for_a_job_that_is_not_scheduled() -> None:
    row = JobRow("j", 0, b"{}", 2, "cancelled", None, None)
    view = JobView(row, {}, "UTC", (), None, None, None, (), 0, "ns.fired")
    html = job_page(view, namespace="ns", nonce="n", now_ms=T0,
                    actions=list(JOB_ACTIONS.values()))
    assert 'id="action-cancel"' not in html
    scheduled = JobView(JobRow("j", 0, b"{}", 1, "scheduled", T0, T0), {}, "UTC", (), None,
                        None, None, (), 0, "ns.fired")
    assert 'id="action-cancel"' in job_page(scheduled, namespace="ns", nonce="n", now_ms=T0,
                                             actions=list(JOB_ACTIONS.values()))


async def test_actions_are_disabled_without_a_token_and_rebound_hosts_refused() -> None:
    """The HTTP layer alone: these refusals happen before any source is read."""
    from aiohttp.test_utils import TestClient, TestServer
    from chronowheel.console.app import Console

    def no_client() -> Any:
        raise AssertionError("no command may be sent")

    for token, status in ((None, 403), (Secret("t"), 401)):
        console = Console(None, Guard.create(token, "127.0.0.1"),  # type: ignore[arg-type]
                          namespace="ns", client=no_client)
        async with TestClient(TestServer(console.app(), host="127.0.0.1")) as http:
            confirm = await http.get("/jobs/confirm?id=j&action=cancel")
            assert confirm.status == status
            act = await http.post("/jobs/action", data={"id": "j", "action": "cancel",
                                                        "csrf": "x"})
            assert act.status == status
            assert "default-src 'none'" in act.headers["Content-Security-Policy"]
            assert act.headers["X-Frame-Options"] == "DENY"
            if token is not None:
                assert "Basic" in act.headers["WWW-Authenticate"]
                # the right token but no CSRF cookie: refused before anything is sent
                forged = await http.post("/jobs/action", headers={"Authorization": "Bearer t"},
                                         data={"id": "j", "action": "cancel", "csrf": "x"})
                assert forged.status == 403 and "CSRF" in await forged.text()
                other = await http.post("/jobs/action", headers={
                    "Authorization": "Bearer t", "Origin": "http://evil.example"},
                    data={"id": "j", "action": "cancel", "csrf": "x"})
                assert other.status == 403 and "Origin" in await other.text()
            rebound = await http.get("/", headers={"Host": "evil.example"})
            assert rebound.status == 421


# --- dead letters: what a redrive would do --------------------------------------------------

async def dead_letters() -> tuple[MemoryStore, list[TailMessage]]:
    """Dead letters of one job: one ready, one redriven before (its request row), a
    payload-less stand-in and one whose retry names a topic the policy refuses."""
    from chronowheel.worker.policy import minimal_dead_letter

    from tests.unit.test_dead import job, letter

    store = MemoryStore()
    recs = [letter(0, i, "a-1") for i in range(4)]
    key, value, headers = minimal_dead_letter(recs[2].key, recs[2].value or b"",
                                              recs[2].headers, b"too_large: over 1 MiB")
    recs[2].key, recs[2].value, recs[2].headers = key, value, list(headers)
    recs[3].headers = [(k, b"not-allowed.topic" if k == wire.SOURCE_TOPIC else v)
                       for k, v in recs[3].headers]
    await store.put_jobs([job("a-1", "t")])
    letters = [TailMessage("acme.dead", r.partition, r.offset, T0, r.key, r.value,
                           tuple(r.headers)) for r in recs]
    return store, letters


async def test_the_dead_letter_page_says_what_a_redrive_would_do_with_each_letter() -> None:
    from chronowheel.client.dead import REDRIVE_KIND, redrive_request_id
    from chronowheel.console.sources import redrive_states
    from chronowheel.core.shard import shard_of
    from chronowheel.store.base import RequestRow

    from tests.unit.test_dead import NOW, SETTINGS

    store, letters = await dead_letters()
    shard = shard_of("a-1", SETTINGS.shards)
    await store.put_request(RequestRow(shard, "a-1", redrive_request_id(0, 1), REDRIVE_KIND,
                                       NOW, NOW, None, 1, 1, b"", 3600))
    states = await redrive_states(letters, store, shards=SETTINGS.shards,
                                  policy=ValidationPolicy.from_settings(SETTINGS),
                                  retention_s=3600, now_ms=NOW)
    assert states["0@0"] == ("ready", None)
    assert states["0@1"] == ("redriven", None)
    kind, why = states["0@2"]
    assert kind == "refused" and why is not None and "payload-less stand-in" in why
    kind, why = states["0@3"]
    assert kind == "refused" and why is not None and why.startswith("its retry is invalid")
    assert len(store.requests) == 1  # a dry run: nothing recorded
    html = tail_page(topic="acme.dead", messages=[message_json(m) for m in letters],
                     reason_header=wire.ERROR, active="dead", title="Dead letters",
                     namespace="acme", nonce="n", now_ms=NOW, redrive=states)
    assert "<th>Redrive</th>" in html
    assert "chronowheel dead redrive --namespace acme --job a-1 --dry-run" in html
    assert html.count('class="redrive ok">ready<') == 1
    assert html.count('class="redrive muted">redriven<') == 1
    assert html.count('class="redrive bad">refused<') == 2
    # Other tails have no such column.
    plain = tail_page(topic="acme.rejected", messages=[], reason_header=wire.REASON,
                      active="rejected", title="Rejected", namespace="acme", nonce="n",
                      now_ms=NOW)
    assert "Redrive" not in plain


def test_the_redrive_column_escapes_the_reason_and_quotes_the_command() -> None:
    html = tail_page(topic="ns.dead", messages=[
        {"topic": "ns.dead", "partition": 0, "offset": 1, "timestamp_ms": T0, "key": HOSTILE,
         "headers": {wire.JOB_ID: HOSTILE}, "payload": None},
        {"topic": "ns.dead", "partition": 0, "offset": 2, "timestamp_ms": T0, "key": "k",
         "headers": {}, "payload": None}],
        reason_header=wire.ERROR, active="dead", title="Dead letters", namespace="ns",
        nonce="n", now_ms=T0, redrive={"0@1": ("ready", None), "0@2": ("refused", HOSTILE)})
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert "--job &#x27;&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#x27;" in html


class FakeSources:
    """What the dead-letter page reads of the console's sources: `letters` as `<ns>.dead`
    and their redrive states on `store` at `now_ms`."""

    def __init__(self, store: MemoryStore, letters: list[TailMessage], now_ms: int) -> None:
        from tests.unit.test_dead import SETTINGS

        self.settings = SETTINGS
        self.store = store
        self.letters = letters
        self.now_ms = now_ms

    async def tail_messages(self, topic: str) -> list[TailMessage]:
        assert topic == self.settings.dead_topic
        return self.letters

    async def redrive_states(self, shown: list[TailMessage]) -> dict[str, Any]:
        from chronowheel.console.sources import redrive_states

        return await redrive_states(shown, self.store, shards=self.settings.shards,
                                    policy=ValidationPolicy.from_settings(self.settings),
                                    retention_s=3600, now_ms=self.now_ms)


async def test_the_dead_letter_route_shows_the_redrive_column_and_sends_nothing() -> None:
    from aiohttp.test_utils import TestClient, TestServer
    from chronowheel.console.app import Console

    store, letters = await dead_letters()

    def no_client() -> Any:
        raise AssertionError("no command may be sent")

    console = Console(FakeSources(store, letters, T0),  # type: ignore[arg-type]
                      Guard.create(None, "127.0.0.1"),
                      namespace="acme", client=no_client)
    async with TestClient(TestServer(console.app(), host="127.0.0.1")) as http:
        response = await http.get("/dead")
        assert response.status == 200
        html = await response.text()
    assert "<th>Redrive</th>" in html and html.count('class="redrive ') == 4
    assert "<form" not in html  # read-only: no action on this page


async def test_two_first_uses_at_once_start_one_client() -> None:
    """The client starts on first use; two requests needing it at once (its start awaits)
    create and start one client, not two (the second would leak its producer)."""
    import asyncio

    from chronowheel.console.app import Console

    made: list[Any] = []

    class SlowClient:
        async def start(self) -> SlowClient:
            await asyncio.sleep(0.01)
            return self

    def client() -> Any:
        made.append(SlowClient())
        return made[-1]

    console = Console(None, Guard.create(None, "127.0.0.1"),  # type: ignore[arg-type]
                      namespace="ns", client=client)
    first, second = await asyncio.gather(console.client(), console.client())
    assert len(made) == 1 and first is second is made[0]
    assert await console.client() is made[0]


async def test_a_failed_redrive_says_whether_confirming_again_sends_a_second_copy() -> None:
    """A retry Kafka did not take is sent by confirming again; one Kafka took whose request
    row was not written was sent, and confirming again sends a second copy."""
    from chronowheel.client.dead import DeadSelector, RedriveSummary
    from chronowheel.console.actions import LETTER_ACTIONS

    class FailingClient:
        def __init__(self, unrecorded: bool) -> None:
            self.unrecorded = unrecorded

        async def redrive(self, *, letter: str) -> RedriveSummary:
            s = RedriveSummary(DeadSelector(), matched=1)
            s.failed.append((letter, RuntimeError("timed out")))
            if self.unrecorded:
                s.unrecorded.append(letter)
            return s

    run = LETTER_ACTIONS["redrive"].run
    with pytest.raises(ChronowheelError) as not_sent:
        await run(FailingClient(False), "0@1")  # type: ignore[arg-type]
    assert "was not sent" in str(not_sent.value)
    assert "confirming again sends it" in str(not_sent.value)
    with pytest.raises(ChronowheelError) as unwritten:
        await run(FailingClient(True), "0@1")  # type: ignore[arg-type]
    text = str(unwritten.value)
    assert "was sent (Kafka took it)" in text and "request row was not written" in text
    assert "second copy" in text and "confirming again sends it" not in text


# --- dead letters: the redrive of one letter --------------------------------------------------

def dead_console(store: MemoryStore, letters: list[TailMessage], token: Secret | None,
                 producer: Any) -> Any:
    """A console over the in-memory store whose client redrives through `producer`, reading
    `letters` as `<ns>.dead`."""
    from chronowheel.client import SchedulerClient
    from chronowheel.client.dead import memory_reader
    from chronowheel.console.app import Console

    from tests.unit.test_dead import NOW, SETTINGS

    def client() -> SchedulerClient:
        return SchedulerClient(SETTINGS, producer=producer, store=store, now_ms=lambda: NOW,
                               dead_letters=memory_reader(letters))

    return Console(FakeSources(store, letters, NOW),  # type: ignore[arg-type]
                   Guard.create(token, "127.0.0.1"),
                   namespace="acme", client=client)


def retries(producer: Any) -> list[tuple[str, int]]:
    """(job id, attempt) of every retry command sent."""
    out = []
    for topic, key, value in producer.sent:
        doc = orjson.loads(value)
        assert topic == "acme.submit" and doc["op"] == "retry" and key == doc["id"].encode()
        out.append((doc["id"], doc["attempt"]))
    return out


async def test_a_dead_letter_is_redriven_once_from_its_confirmation_page() -> None:
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer
    from chronowheel.core.shard import shard_of

    from tests.unit.test_client import FakeProducer, acking
    from tests.unit.test_dead import SETTINGS

    store, letters = await dead_letters()
    producer = FakeProducer()
    acks = asyncio.ensure_future(acking(producer))
    auth = {"Authorization": "Bearer t"}
    console = dead_console(store, letters, Secret("t"), producer)
    try:
        async with TestClient(TestServer(console.app(), host="127.0.0.1")) as http:
            html = await (await http.get("/dead")).text()
            # a button for each ready letter (0@0, 0@1), to its confirmation page
            assert html.count('class="btn redrive-action"') == 2
            assert 'href="/dead/confirm?id=0%400&amp;action=redrive"' in html
            confirm = await http.get("/dead/confirm?id=0@0&action=redrive", headers=auth)
            assert confirm.status == 200
            page = await confirm.text()
            # what will be sent, exactly: the retry command, its key and request id
            assert "One retry command to acme.submit, key a-1, under the request id " \
                   "redrive:0@0" in page
            shown = orjson.loads(page.split('<pre id="preview-command">', 1)[1]
                                 .split("</pre>", 1)[0].replace("&quot;", '"'))
            assert (shown["op"], shown["id"], shown["attempt"]) == ("retry", "a-1", 6)
            csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            assert 'action="/dead/action"' in page and csrf

            # refused before anything is sent: no CSRF token, a wrong one, one of another
            # letter, a job action's token, another origin
            for form, headers in (
                    ({"id": "0@0", "action": "redrive"}, auth),
                    ({"id": "0@0", "action": "redrive", "csrf": "x" * 64}, auth),
                    ({"id": "0@1", "action": "redrive", "csrf": csrf}, auth),
                    ({"id": "0@0", "action": "redrive", "csrf": csrf},
                     {**auth, "Origin": "http://evil.example"})):
                refused = await http.post("/dead/action", data=form, headers=headers,
                                          allow_redirects=False)
                assert refused.status == 403, form
            job_token = console.guard.csrf_token(
                http.session.cookie_jar.filter_cookies(http.make_url("/"))["cw_csrf"].value,
                "job:cancel", "0@0")
            crossed = await http.post("/jobs/action", data={
                "id": "0@0", "action": "cancel", "csrf": csrf}, headers=auth)
            assert crossed.status == 403
            crossed = await http.post("/dead/action", data={
                "id": "0@0", "action": "redrive", "csrf": job_token}, headers=auth)
            assert crossed.status == 403
            assert producer.sent == []

            # the POST redrives that letter, once; a second submit sends nothing
            form = {"id": "0@0", "action": "redrive", "csrf": csrf}
            done = await http.post("/dead/action", data=form, headers=auth,
                                   allow_redirects=False)
            assert done.status == 303
            assert unquote(done.headers["Location"]) == "/dead?letter=0@0&redrive=redriven"
            assert retries(producer) == [("a-1", 6)]
            row = await store.get_request(shard_of("a-1", SETTINGS.shards), "a-1",
                                          "redrive:0@0")
            assert row is not None and row.kind == "redrive"
            again = await http.post("/dead/action", data=form, headers=auth,
                                    allow_redirects=False)
            assert unquote(again.headers["Location"]) == "/dead?letter=0@0&redrive=already"
            assert retries(producer) == [("a-1", 6)]

            shown_after = await (await http.get(again.headers["Location"])).text()
            assert 'id="notice"' in shown_after and "redriven before" in shown_after
            assert 'id="redrive-0-0"' not in shown_after and 'id="redrive-0-1"' in shown_after
            assert shown_after.count('class="redrive muted">redriven<') == 1
            # its confirmation page now says nothing would be sent, and has no form
            late = await (await http.get("/dead/confirm?id=0@0&action=redrive",
                                         headers=auth)).text()
            assert "was redriven before" in late and "<form" not in late
            refused_letter = await (await http.get("/dead/confirm?id=0@2&action=redrive",
                                                   headers=auth)).text()
            assert "cannot be redriven" in refused_letter and "<form" not in refused_letter
            # not a position (a superscript two is a digit to str.isdigit, not to int())
            for wrong in ("nowhere", "0@²", "²@0"):
                bad = await http.get("/dead/confirm", params={"id": wrong, "action": "redrive"},
                                     headers=auth)
                assert bad.status == 400, wrong
    finally:
        acks.cancel()


async def test_a_double_submit_of_a_redrive_sends_the_letter_once() -> None:
    """Two POSTs of the same confirmation at once (a double click): the second waits for the
    first, whose retry is not yet acknowledged, then finds it recorded; one retry."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from tests.unit.test_client import FakeProducer, acking

    async def until(condition: Any) -> None:
        async def poll() -> None:
            while not condition():
                await asyncio.sleep(0)
        await asyncio.wait_for(poll(), 10)

    store, letters = await dead_letters()
    producer = FakeProducer()  # acknowledges nothing until told
    auth = {"Authorization": "Bearer t"}
    console = dead_console(store, letters, Secret("t"), producer)
    acks = None
    try:
        async with TestClient(TestServer(console.app(), host="127.0.0.1")) as http:
            page = await (await http.get("/dead/confirm?id=0@0&action=redrive",
                                         headers=auth)).text()
            csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            form = {"id": "0@0", "action": "redrive", "csrf": csrf}

            def post() -> Any:
                return asyncio.ensure_future(http.post("/dead/action", data=form,
                                                       headers=auth, allow_redirects=False))

            first = post()
            await until(lambda: len(producer.sent) == 1)  # sent, not acknowledged
            second = post()
            key = ("letter", "redrive", "0@0")
            await until(lambda: console.running[key].requests == 2 or len(producer.sent) > 1)
            acks = asyncio.ensure_future(acking(producer))
            both = [await first, await second]
            outcomes = [r.headers["Location"].rsplit("=", 1)[1] for r in both]
            assert console.running == {}
    finally:
        if acks is not None:
            acks.cancel()
    assert outcomes == ["redriven", "already"]
    assert retries(producer) == [("a-1", 6)]


async def test_without_a_token_the_redrive_button_is_disabled_and_its_routes_refused() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from tests.unit.test_client import FakeProducer

    store, letters = await dead_letters()
    producer = FakeProducer()
    async with TestClient(TestServer(dead_console(store, letters, None, producer).app(),
                                     host="127.0.0.1")) as http:
        html = await (await http.get("/dead")).text()
        buttons = html.split('class="btn redrive-action"')[1:]
        assert len(buttons) == 2
        assert all(" disabled " in b.split(">", 1)[0] for b in buttons)
        assert "/dead/confirm" not in html and "<form" not in html
        confirm = await http.get("/dead/confirm?id=0@0&action=redrive")
        assert confirm.status == 403 and "disabled" in await confirm.text()
        act = await http.post("/dead/action", data={"id": "0@0", "action": "redrive",
                                                    "csrf": "x"})
        assert act.status == 403
    assert producer.sent == [] and len(store.requests) == 0


def test_a_forged_redrive_notice_shows_nothing_but_known_outcomes() -> None:
    from chronowheel.console.pages import redrive_notice

    assert "redriven" in redrive_notice("0@1", "redriven", "acme.submit")
    with pytest.raises(KeyError):
        redrive_notice("0@1", HOSTILE, "acme.submit")

"""The console in a real browser (Debian's chromium driven by Playwright) against the real
stack: a `chronowheel node` process, a `chronowheel console` process, jobs submitted through
the client, what fired checked by a read_committed reader.

Screenshots go to tests/artifacts/console/ (ignored by git) for a person to look at.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from chronowheel.bus.kafka import reader
from chronowheel.client import SchedulerClient
from chronowheel.core.buckets import MINUTE_MS, minute_of
from chronowheel.core.shard import shard_of
from chronowheel.settings import Settings
from chronowheel.testing import NodeProcess

from testkit.fleet import until
from tests.integration.harness import (
    REPO,
    collecting,
    make_namespace,
    now_ms,
    produce,
    settled,
)

pytestmark = pytest.mark.integration

ARTIFACTS = REPO / "tests" / "artifacts" / "console"
CHROMIUM = os.environ.get("CHRONOWHEEL_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser")
HERD = 260
PAIR_LEADS_MS = (30_000, 45_000, 60_000, 90_000)
"""Leads of the (job to cancel, control job) pairs planted before the browser starts."""
CANCEL_ROOM_MS = 20_000
"""The least time left before a pair's instant for the test to cancel that pair's job."""
TOKEN = "console-test-" + secrets.token_hex(8)


def chromium_or_skip() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (./run bootstrap installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return CHROMIUM


class ConsoleProcess(NodeProcess):
    """`chronowheel console` as a child process; its URL comes from the line it prints."""

    async def url(self, timeout_s: float = 60) -> str:
        """Waits for the line; fails at once if the console exits before printing it."""
        found: list[str] = []

        def printed() -> bool:
            match = re.search(r"console: (http://\S+/)", self.log_text())
            if match:
                found.append(match.group(1).rstrip("/"))
                return True
            if not self.alive():
                raise AssertionError(f"the console exited without a URL:\n{self.log_tail()}")
            return False

        try:
            await until(printed, timeout_s, "the console's URL", poll_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the console printed no URL:\n{self.log_tail()}") \
                from None
        return found[0]


@pytest.fixture
async def scene(stack: Any, namespace: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """A namespace with a node, a herd planted in one minute, jobs to cancel, a rejected
    command, and a console with a token."""
    # Jobs may name topics under "gone." that do not exist: their occurrences are
    # dead-lettered by the node, which gives the dead-letter tail something to show.
    settings = await make_namespace(stack, namespace, shards=4, allowed_topics=r"gone\..*")
    node = NodeProcess(settings, tmp_path / "node.log", name="node", cwd=REPO,
                       env={"CHRONOWHEEL_NODE_SESSION_TIMEOUT_MS": "6000",
                            "CHRONOWHEEL_ALLOWED_TOPICS": settings.allowed_topics})
    console = ConsoleProcess(settings, tmp_path / "console.log", name="console", cwd=REPO,
                             args=("console", "--http-port", "0"),
                             env={"CHRONOWHEEL_CONSOLE_TOKEN": TOKEN,
                                  "CHRONOWHEEL_ALLOWED_TOPICS": settings.allowed_topics})
    node.start()
    try:
        await node.wait_ready()
        now = now_ms()
        # The herd: the minute after next, far enough ahead that nothing of it fires here.
        herd_minute = minute_of(now) + 20 * MINUTE_MS
        # The cancel through the page must come before its job's instant (asserted below): it
        # began about 6 s after this on a quiet machine, but over 30 s once on a loaded CI
        # machine (the browser's start and the cluster page's refresh). So pairs of a job to
        # cancel and a control job are planted at several leads, and the test cancels the
        # first pair still CANCEL_ROOM_MS ahead when it gets there: it waits for that pair's
        # control job only, not for the longest lead every time.
        pairs = {lead_ms: now + lead_ms for lead_ms in PAIR_LEADS_MS}
        async with SchedulerClient(settings) as client:
            for i in range(HERD):
                await client.schedule(f"herd-{i:04d}", herd_minute + 30_000, {"i": i})
            for i in range(40):
                # after the herd's minute, so they add nothing to it
                await client.schedule(f"spread-{i:03d}", herd_minute + 120_000 + i * 97_000,
                                      None)
            for lead_ms, fire_at in pairs.items():
                await client.schedule(f"to-cancel-{lead_ms // 1000}", fire_at, {"cancel": "me"})
                await client.schedule(f"control-{lead_ms // 1000}", fire_at, {"keep": "me"})
            await client.cron("nightly", "30 2 * * *", tz="Europe/Paris", payload={"n": 1})
            await client.schedule("nowhere", now + 2_000, {"lost": True}, topic="gone.away")
        await produce(settings, [(b"broken", b'{"v":1,"op":"upsert","job":{"id":"broken"}}')])
        console.start()
        url = await console.url()
        yield {"settings": settings, "node": node, "console": console, "url": url,
               "herd_minute": herd_minute, "pairs": pairs}
    finally:
        console.stop()
        node.stop()


async def wait_job_status(page: Any, url: str, job_id: str, status: str,
                          timeout_s: float = 60) -> None:
    """Reload the job's page until it shows `status`."""

    async def shown() -> bool:
        await page.goto(f"{url}/jobs?id={job_id}")
        cell = page.locator("#job-status")
        return bool(await cell.count()) and (await cell.inner_text()) == status

    try:
        await until(shown, timeout_s, f"job {job_id} to be {status}", poll_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {await page.content()}") from None


async def test_console_pages_heat_map_cancel_and_safety(scene: dict[str, Any]) -> None:
    from playwright.async_api import async_playwright

    executable = chromium_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    settings: Settings = scene["settings"]
    url: str = scene["url"]
    herd_minute: int = scene["herd_minute"]
    async with collecting(settings) as fired, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable,
                                           args=["--no-sandbox", "--disable-gpu"])
        try:
            anonymous = await browser.new_context(viewport={"width": 1500, "height": 1000})
            operator = await browser.new_context(
                viewport={"width": 1500, "height": 1000},
                http_credentials={"username": "ops", "password": TOKEN})
            page = await operator.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

            # --- cluster: the node owns every shard; the live refresh replaces the table
            await page.goto(url + "/")
            await page.wait_for_function(
                "() => document.querySelectorAll('#nodes tbody tr').length === 1", timeout=30_000)
            owners = await page.locator("#shards tbody tr td:nth-child(2)").all_inner_texts()
            assert len(owners) == 4 and all("(none)" not in o for o in owners), owners
            await page.wait_for_function(
                "() => Number(document.getElementById('live').dataset.refreshed) > 0",
                timeout=15_000)
            await page.screenshot(path=str(ARTIFACTS / "cluster.png"), full_page=True)

            # --- cancel: refused without the token, then done through the page with it
            chosen_at = now_ms()
            lead_ms, fire_at = next(
                ((lead, at) for lead, at in scene["pairs"].items()
                 if at - now_ms() >= CANCEL_ROOM_MS), max(scene["pairs"].items()))
            to_cancel, control = f"to-cancel-{lead_ms // 1000}", f"control-{lead_ms // 1000}"
            await wait_job_status(page, url, to_cancel, "scheduled")
            lurker = await anonymous.new_page()
            await lurker.goto(f"{url}/jobs?id={to_cancel}")
            # (a navigation would stop at the browser's basic-auth prompt: ask directly)
            refused = await lurker.request.get(
                f"{url}/jobs/confirm?id={to_cancel}&action=cancel")
            assert refused.status == 401
            assert "Basic" in refused.headers.get("www-authenticate", "")
            posted = await lurker.request.post(f"{url}/jobs/action", form={
                "id": to_cancel, "action": "cancel", "csrf": "x"})
            assert posted.status == 401

            await page.goto(f"{url}/jobs?id={to_cancel}")
            await page.click("#action-cancel")
            await page.wait_for_selector("#confirm-form")
            await page.screenshot(path=str(ARTIFACTS / "confirm.png"), full_page=True)
            # with the token but without the form's CSRF token: refused, nothing sent
            forged = await page.request.post(f"{url}/jobs/action", form={
                "id": to_cancel, "action": "cancel"})
            assert forged.status == 403 and "CSRF" in await forged.text()
            forged = await page.request.post(f"{url}/jobs/action", form={
                "id": control, "action": "cancel",
                "csrf": await page.locator("input[name=csrf]").input_value()})
            assert forged.status == 403  # the token is bound to its job
            await page.click("#confirm")
            await page.wait_for_selector("#notice")
            await wait_job_status(page, url, to_cancel, "cancelled")
            assert now_ms() < fire_at, (
                "the cancel was applied after the job's instant: the check that it does not "
                f"fire would prove nothing (the pair of {lead_ms // 1000} s was chosen "
                f"{(fire_at - chosen_at) / 1000:.1f} s before its instant; the cancel took "
                f"{(now_ms() - chosen_at) / 1000:.1f} s)")
            assert await page.locator("#next-occurrences").count() == 0
            await page.screenshot(path=str(ARTIFACTS / "cancelled.png"), full_page=True)

            # --- upcoming: the herd is the busiest minute and the hottest cell on the canvas
            await wait_counted(page, url, herd_minute, HERD)
            await page.wait_for_selector("#heat[data-drawn='1']")
            first = await page.locator("#busiest tbody tr").first.inner_text()
            assert first.split()[0] == _rfc3339(herd_minute), first
            geometry = orjson.loads(await page.locator("#heat-data").inner_text())
            column = (herd_minute - geometry["first"]) // MINUTE_MS
            counts = geometry["counts"]
            hottest = max(range(4), key=lambda k: counts[k][column])
            # counts are upper bounds (a retried count adds again): the rows are exact below
            assert sum(counts[k][column] for k in range(4)) >= HERD
            x = geometry["x0"] + column * geometry["cell_w"]
            y = geometry["y0"] + hottest * geometry["cell_h"] + 1
            rgb = await page.evaluate(
                "([x, y]) => Array.from(document.getElementById('heat').getContext('2d')"
                ".getImageData(x, y, 1, 1).data)", [x, y])
            # the top of the scale is a deep red; a cell of one spread job is a pale blue
            assert rgb[0] > 150 and rgb[1] < 90 and rgb[2] < 90, rgb
            await page.screenshot(path=str(ARTIFACTS / "upcoming.png"), full_page=True)

            # clicking the herd cell lists its rows
            box = await page.locator("#heat").bounding_box()
            assert box is not None
            await page.mouse.click(box["x"] + x + 0.5, box["y"] + y + 1)
            await page.wait_for_url(re.compile(rf"/upcoming/minute\?m={herd_minute}&shard="
                                               rf"{hottest}$"))
            ids = await page.locator("#due-rows tbody tr td:first-child").all_inner_texts()
            assert ids and len(ids) <= counts[hottest][column], ids
            assert all(shard_of(i, 4) == hottest and i.startswith("herd-") for i in ids)

            # all shards of the minute, paged by 100
            await page.goto(f"{url}/upcoming/minute?m={herd_minute}")
            seen: list[str] = []
            while True:
                seen += await page.locator("#due-rows tbody tr td:first-child").all_inner_texts()
                nxt = page.locator("#next-page")
                if not await nxt.count():
                    break
                await nxt.click()
                await page.wait_for_load_state()
            assert sorted(seen) == [f"herd-{i:04d}" for i in range(HERD)]
            await page.screenshot(path=str(ARTIFACTS / "minute.png"), full_page=True)

            # --- jobs: a cron job's next occurrences in its own zone
            await page.goto(url + "/jobs")
            await page.fill("input[name=id]", "nightly")
            await page.click("button[type=submit]")
            await page.wait_for_selector("#next-occurrences")
            zoned = await page.locator("#next-occurrences tbody tr td:first-child") \
                .all_inner_texts()
            assert len(zoned) == 10 and all("T02:30:00+0" in z for z in zoned), zoned
            await page.screenshot(path=str(ARTIFACTS / "job.png"), full_page=True)

            # --- the rejected tail shows the reason
            await page.goto(url + "/rejected")
            reasons = await page.locator("#tail .reason").all_inner_texts()
            assert reasons == ["job: exactly one of at, cron, every"], reasons
            await page.screenshot(path=str(ARTIFACTS / "rejected.png"), full_page=True)
            reasons = []

            async def dead_letter_shown() -> bool:
                nonlocal reasons
                await page.goto(url + "/dead")
                reasons = await page.locator("#tail .reason").all_inner_texts()
                return bool(reasons)

            await until(dead_letter_shown, 60, "the dead letter on /dead", poll_s=0.5)
            # cw-error is `Type: message`, as on every dead letter (wire contract)
            assert reasons == ["UnknownTopic: target topic gone.away is unavailable"], reasons
            keys = await page.locator("#tail td:nth-child(3)").all_inner_texts()
            assert keys == ["nowhere"], keys
            # what a redrive would do with it: send it again (the console sends nothing)
            redrive = await page.locator("#tail td:nth-child(7)").all_inner_texts()
            assert len(redrive) == 1 and redrive[0].startswith("ready"), redrive
            assert "chronowheel dead redrive" in redrive[0] and "--job nowhere" in redrive[0]
            await page.screenshot(path=str(ARTIFACTS / "dead.png"), full_page=True)

            # --- redrive that letter from the page: sent once, however often it is submitted
            await page.click("#tail .redrive-action")
            await page.wait_for_selector("#confirm-form")
            preview = orjson.loads(await page.locator("#preview-command").inner_text())
            assert (preview["op"], preview["id"], preview["attempt"]) == \
                ("retry", "nowhere", 2), preview
            position = await page.locator("input[name=id]").input_value()
            csrf = await page.locator("input[name=csrf]").input_value()
            assert f"redrive:{position}" in await page.locator("#preview").inner_text()
            await page.screenshot(path=str(ARTIFACTS / "redrive-confirm.png"), full_page=True)
            forged = await page.request.post(f"{url}/dead/action", form={
                "id": position, "action": "redrive"})
            assert forged.status == 403 and "CSRF" in await forged.text()
            assert await retries_of(settings, "nowhere") == []
            await page.click("#confirm")
            await page.wait_for_selector("#notice")
            assert f"Dead letter {position} redriven" in await page.locator("#notice") \
                .inner_text()
            shown = await page.locator("#tail td:nth-child(6)").all_inner_texts()
            states = await page.locator("#tail td:nth-child(7)").all_inner_texts()
            assert states[shown.index(position)].startswith("redriven"), (shown, states)
            await page.screenshot(path=str(ARTIFACTS / "redriven.png"), full_page=True)
            again = await page.request.post(f"{url}/dead/action", form={
                "id": position, "action": "redrive", "csrf": csrf}, max_redirects=0)
            assert again.status == 303 and again.headers["location"].endswith(
                "redrive=already"), again.headers
            assert await retries_of(settings, "nowhere") == [2]
            # the node took it: attempt 2 of the occurrence, dead-lettered again (its topic is
            # still missing), and offered for a redrive of its own

            async def second_letter() -> bool:
                await page.goto(url + "/dead")
                return await page.locator("#tail tbody tr").count() == 2

            await until(second_letter, 60, "the redriven letter's own dead letter", poll_s=0.5)
            headers = await page.locator("#tail td:nth-child(4)").all_inner_texts()
            assert "cw-attempt=2" in headers[0], headers
            # the control job fires; the cancelled one does not (read_committed reader)
            await fired.wait_for(lambda ms: any(m.key == control.encode() for m in ms),
                                 max(30.0, (fire_at - now_ms()) / 1000 + 30), "the control job")
            # everything due up to the control job's instant is read: the cancelled job's too
            await settled(settings, fired, upto_ms=fire_at)
            keys = [m.key for m in fired.messages]
            assert control.encode() in keys and to_cancel.encode() not in keys, keys

            # the job page lists the control job's fired occurrence
            await page.goto(f"{url}/jobs?id={control}")
            fired_rows = await page.locator("#fired tbody tr").all_inner_texts()
            assert len(fired_rows) == 1 and _rfc3339(fire_at) in fired_rows[0], fired_rows
            assert not errors, errors  # no script error, no CSP violation
        finally:
            await browser.close()


async def retries_of(settings: Settings, job_id: str) -> list[int]:
    """The attempts of the retry commands of `job_id` on <ns>.submit (its partition, read
    committed, from the beginning to the end)."""
    tp = TopicPartition(settings.submit_topic, shard_of(job_id, settings.shards))
    consumer = reader(settings, isolation_level="read_committed")
    await consumer.start()
    found: list[int] = []
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        await consumer.seek_to_beginning(tp)
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            for rec in batch.get(tp, ()):
                if rec.key == job_id.encode() and rec.value:
                    doc = orjson.loads(rec.value)
                    if doc.get("op") == "retry":
                        found.append(doc["attempt"])
    finally:
        await consumer.stop()
    return found


async def wait_counted(page: Any, url: str, minute: int, rows: int,
                       timeout_s: float = 60) -> None:
    """Reload the heat map until the node has counted the whole herd."""

    async def counted() -> bool:
        await page.goto(url + "/upcoming")
        data = orjson.loads(await page.locator("#heat-data").inner_text())
        column = (minute - data["first"]) // MINUTE_MS
        return sum(r[column] for r in data["counts"]) >= rows

    await until(counted, timeout_s, f"the herd of {rows} counted on the heat map", poll_s=0.5)


def _rfc3339(ms: int) -> str:
    from chronowheel.ops.format import rfc3339

    return rfc3339(ms)

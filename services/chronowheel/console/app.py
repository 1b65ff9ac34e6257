"""The console's web application (aiohttp): routes, authentication, CSRF, security headers.

Safety, in order of the checks a request meets (docs/console.md, section "Safety"):

- **Host**: on a loopback address only `localhost`, `127.0.0.1` and `[::1]` are accepted as
  Host, so a web page cannot reach the console through a rebound DNS name.
- **Authentication**: `Authorization: Bearer <token>` or basic auth with the token as password
  (the user name is not checked), compared in constant time. Read-only pages need it only when
  the console listens beyond loopback (it refuses to start there without a token); actions
  always need it, and without a configured token they are disabled.
- **CSRF**: an action is a POST whose form carries a token derived (HMAC) from a random cookie
  (`SameSite=Strict`, `HttpOnly`) and the action and subject (a job, a dead letter) it is for;
  a POST without both, or whose Origin is another site, is refused before anything is sent.
- **Headers**: a Content-Security-Policy allowing only this origin and the response's inline
  nonce, no framing, no referrer to other sites, no caching.

No secret is ever rendered: the token is only compared, and pages show no settings.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

from aiohttp import web

from chronowheel.client import SchedulerClient
from chronowheel.console import pages
from chronowheel.console.actions import (
    JOB_ACTIONS,
    JOBS,
    LETTERS,
    REDRIVE_OUTCOMES,
    Action,
    Subject,
)
from chronowheel.console.sources import Sources, now_ms
from chronowheel.core.buckets import minute_of
from chronowheel.errors import ChronowheelError, ConfigError
from chronowheel.ops.tail import message_json
from chronowheel.settings import Secret, Settings

log = logging.getLogger(__name__)

CSRF_COOKIE = "cw_csrf"
LOOPBACK_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")
DUE_PAGE_ROWS = 100
REALM = "chronowheel console"
# The CSP nonce of the response being built, for the page's inline style and script.
NONCE = web.RequestKey("nonce", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: Secret | None) -> None:
    """Refuse to listen beyond loopback without a token."""
    if not is_loopback(host) and token is None:
        raise ConfigError(f"console: refusing to listen on {host} (not loopback) without a "
                          f"token: set CHRONOWHEEL_CONSOLE_TOKEN or "
                          f"CHRONOWHEEL_CONSOLE_TOKEN_FILE")


@dataclass(frozen=True)
class Guard:
    """The authentication and CSRF rules of one console process."""

    token: Secret | None
    loopback: bool
    csrf_key: bytes

    @classmethod
    def create(cls, token: Secret | None, host: str) -> Guard:
        return cls(token, is_loopback(host), secrets.token_bytes(32))

    def authenticated(self, request: web.Request) -> bool:
        if self.token is None:
            return False
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        given: str | None = None
        if scheme.lower() == "bearer":
            given = value.strip()
        elif scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                return False
            given = decoded.partition(":")[2]
        if not given:
            return False
        return hmac.compare_digest(given.encode(), self.token.reveal().encode())

    def csrf_token(self, cookie: str, action: str, job_id: str) -> str:
        message = f"{cookie}\x00{action}\x00{job_id}".encode()
        return hmac.new(self.csrf_key, message, hashlib.sha256).hexdigest()

    def csrf_ok(self, cookie: str | None, form_token: str, action: str, job_id: str) -> bool:
        if not cookie or not form_token:
            return False
        return hmac.compare_digest(self.csrf_token(cookie, action, job_id), form_token)


@dataclass
class Running:
    """An action on one subject, running or waiting: `requests` POSTs of it hold or wait
    for `lock`."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    requests: int = 0


def challenge(message: str) -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(
        text=message + "\n",
        headers={"WWW-Authenticate": f'Basic realm="{REALM}", Bearer realm="{REALM}"'})


class Console:
    def __init__(self, sources: Sources, guard: Guard, *, namespace: str,
                 client: Callable[[], SchedulerClient]) -> None:
        self.sources = sources
        self.guard = guard
        self.namespace = namespace
        self._make_client = client
        self._client: SchedulerClient | None = None
        # Held while the client starts: two first uses at once start one client (a second
        # would leak its producer).
        self._client_lock = asyncio.Lock()
        # One action on one subject at a time: a double submit waits for the first, then
        # finds what it did (a redriven letter's request row).
        self.running: dict[tuple[str, str, str], Running] = {}

    # --- application --------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._protect])
        app.add_routes([
            web.get("/", self.cluster),
            web.get("/cluster/fragment", self.cluster_fragment),
            web.get("/upcoming", self.upcoming),
            web.get("/upcoming/minute", self.minute),
            web.get("/jobs", self.jobs),
            web.get("/rejected", self.rejected),
            web.get("/dead", self.dead),
        ])
        for subject in (JOBS, LETTERS):
            app.add_routes([
                web.get(f"{subject.path}/confirm", self._confirm_route(subject)),
                web.post(f"{subject.path}/action", self._act_route(subject)),
            ])
        app.on_cleanup.append(self._close_client)
        return app

    async def _close_client(self, _app: web.Application) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @web.middleware
    async def _protect(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        nonce = secrets.token_urlsafe(16)
        request[NONCE] = nonce
        try:
            if self.guard.loopback:
                host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") \
                    else request.host
                if host not in LOOPBACK_HOST_NAMES:
                    raise web.HTTPMisdirectedRequest(text=f"unexpected Host {request.host!r}\n")
            if not self.guard.loopback and not self.guard.authenticated(request):
                raise challenge("this console needs the token for every page off loopback")
            response = await handler(request)
        except web.HTTPException as exc:
            response = exc
            if exc.status >= 400 and not exc.text:
                exc.text = exc.reason
        except ChronowheelError as exc:
            log.warning("%s %s failed: %s", request.method, request.path, exc)
            response = web.Response(
                status=503, content_type="text/html",
                text=pages.error_page(503, str(exc), namespace=self.namespace, nonce=nonce))
        h = response.headers
        h["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "connect-src 'self'; img-src 'self' data:; form-action 'self'; "
            "base-uri 'none'; frame-ancestors 'none'")
        h["X-Frame-Options"] = "DENY"
        h["X-Content-Type-Options"] = "nosniff"
        # Not "no-referrer": with it the browser sends `Origin: null` on the form's POST,
        # which the CSRF check must refuse.
        h["Referrer-Policy"] = "same-origin"
        h["Cache-Control"] = "no-store"
        h["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        if isinstance(response, web.HTTPException):
            raise response
        return response

    def _html(self, text: str, status: int = 200) -> web.Response:
        return web.Response(text=text, status=status, content_type="text/html")

    # --- read-only pages ----------------------------------------------------------------
    async def cluster(self, request: web.Request) -> web.Response:
        view = await self.sources.cluster()
        return self._html(pages.cluster_page(view, namespace=self.namespace,
                                             nonce=request[NONCE]))

    async def cluster_fragment(self, request: web.Request) -> web.Response:
        return self._html(pages.cluster_fragment(await self.sources.cluster()))

    async def upcoming(self, request: web.Request) -> web.Response:
        load = await self.sources.upcoming()
        return self._html(pages.heat_page(load.heat, namespace=self.namespace,
                                          nonce=request[NONCE], now_ms=now_ms(),
                                          elapsed_ms=load.read_ms, read_at_ms=load.read_at_ms))

    async def minute(self, request: web.Request) -> web.Response:
        q = request.query
        minute = minute_of(_int_param(q.get("m"), "m"))
        shard = None if q.get("shard") in (None, "") else _int_param(q.get("shard"), "shard")
        if shard is not None and not 0 <= shard < self.sources.shards:
            raise web.HTTPBadRequest(text=f"shard: must be 0..{self.sources.shards - 1}, got "
                                          f"{shard}")
        try:
            due = await self.sources.due_rows(minute, shard, q.get("after") or None,
                                              DUE_PAGE_ROWS)
        except ValueError:
            raise web.HTTPBadRequest(text="after: not a cursor of this page") from None
        counts = None
        if shard is None:
            hm = await self.sources.heat_map(minute, minutes=1)
            counts = [row[0] for row in hm.counts]
        return self._html(pages.minute_page(due, namespace=self.namespace,
                                            nonce=request[NONCE], now_ms=now_ms(),
                                            counts=counts))

    async def jobs(self, request: web.Request) -> web.Response:
        job_id = request.query.get("id", "").strip()
        nonce = request[NONCE]
        if not job_id:
            return self._html(pages.jobs_page(namespace=self.namespace, nonce=nonce))
        view = await self.sources.job(job_id)
        if view is None:
            message = (f'<p class="bad" id="not-found">No job {pages.esc(job_id)!s} (a command '
                       "still in the submit topic is not applied yet).</p>")
            return self._html(pages.jobs_page(namespace=self.namespace, nonce=nonce,
                                              message=message, value=job_id), status=404)
        notice = ""
        sent = JOB_ACTIONS.get(request.query.get("sent", ""))
        if sent is not None:
            notice = pages.sent_notice(
                sent, self.sources.settings.submit_topic,
                _int_param(request.query.get("partition"), "partition"),
                _int_param(request.query.get("offset"), "offset"))
        return self._html(pages.job_page(view, namespace=self.namespace, nonce=nonce,
                                         now_ms=now_ms(), actions=list(JOB_ACTIONS.values()),
                                         notice=notice))

    async def rejected(self, request: web.Request) -> web.Response:
        return await self._tail(request, "rejected", self.sources.settings.rejected_topic,
                                "Rejected commands")

    async def dead(self, request: web.Request) -> web.Response:
        topic = self.sources.settings.dead_topic
        letters = await self.sources.tail_messages(topic)
        notice = ""
        outcome, position = request.query.get("redrive"), request.query.get("letter", "")
        if outcome in REDRIVE_OUTCOMES and LETTERS.valid(position):
            notice = pages.redrive_notice(position, outcome,
                                          self.sources.settings.submit_topic)
        return self._html(pages.tail_page(
            topic=topic, messages=[message_json(m) for m in letters],
            reason_header=pages.REASON_HEADERS["dead"], active="dead", title="Dead letters",
            namespace=self.namespace, nonce=request[NONCE], now_ms=now_ms(),
            redrive=await self.sources.redrive_states(letters),
            actions=self.guard.token is not None, notice=notice))

    async def _tail(self, request: web.Request, kind: str, topic: str,
                    title: str) -> web.Response:
        messages = await self.sources.tail(topic)
        return self._html(pages.tail_page(
            topic=topic, messages=messages, reason_header=pages.REASON_HEADERS[kind],
            active=kind, title=title, namespace=self.namespace, nonce=request[NONCE],
            now_ms=now_ms()))

    # --- actions ------------------------------------------------------------------------
    def _require_token(self, request: web.Request) -> None:
        if self.guard.token is None:
            raise web.HTTPForbidden(text="actions are disabled: start the console with "
                                         "CHRONOWHEEL_CONSOLE_TOKEN set")
        if not self.guard.authenticated(request):
            raise challenge("actions need the console token (bearer or basic auth)")

    @staticmethod
    def _action(subject: Subject, name: str | None) -> Action:
        action = subject.actions.get(name or "")
        if action is None:
            raise web.HTTPBadRequest(text=f"action: unknown {name!r} for a {subject.kind} "
                                          f"(known: {', '.join(subject.actions)})")
        return action

    @staticmethod
    def _subject_id(subject: Subject, raw: object) -> str:
        subject_id = str(raw or "")
        if not subject_id:
            raise web.HTTPBadRequest(text="id: missing")
        if not subject.valid(subject_id):
            raise web.HTTPBadRequest(text=f"id: not a {subject.kind}: {subject_id!r}")
        return subject_id

    async def client(self) -> SchedulerClient:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    self._client = await self._make_client().start()
        return self._client

    def _confirm_route(self, subject: Subject) -> Handler:
        async def confirm(request: web.Request) -> web.Response:
            return await self.confirm(request, subject)
        return confirm

    def _act_route(self, subject: Subject) -> Handler:
        async def act(request: web.Request) -> web.Response:
            return await self.act(request, subject)
        return act

    async def confirm(self, request: web.Request, subject: Subject = JOBS) -> web.Response:
        """The confirmation page of an action: the question, what will be sent (the
        action's preview, when it has one) and the form with its CSRF token."""
        self._require_token(request)
        action = self._action(subject, request.query.get("action"))
        subject_id = self._subject_id(subject, request.query.get("id"))
        preview = None
        if action.preview is not None:
            preview = await action.preview(await self.client(), subject_id)
        cookie = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        response = self._html(pages.confirm_page(
            action, subject_id, namespace=self.namespace, nonce=request[NONCE],
            csrf=self.guard.csrf_token(cookie, _csrf_action(subject, action), subject_id),
            subject=subject, preview=preview))
        response.set_cookie(CSRF_COOKIE, cookie, httponly=True, samesite="Strict", path="/")
        return response

    async def act(self, request: web.Request, subject: Subject = JOBS) -> web.Response:
        """The POST of a confirmation page: checked (token, Origin, CSRF) before anything
        runs, then the action, then back to the subject's page with what it did."""
        self._require_token(request)
        origin = request.headers.get("Origin")
        if origin is not None and origin.split("://", 1)[-1] != request.host:
            raise web.HTTPForbidden(text=f"Origin {origin} is not this console")
        form = await request.post()
        subject_id = str(form.get("id", ""))
        action = self._action(subject, str(form.get("action", "")))
        if not self.guard.csrf_ok(request.cookies.get(CSRF_COOKIE), str(form.get("csrf", "")),
                                  _csrf_action(subject, action), subject_id):
            raise web.HTTPForbidden(text="CSRF check failed: submit the action from its "
                                         "confirmation page")
        subject_id = self._subject_id(subject, subject_id)
        client = await self.client()
        key = (subject.kind, action.name, subject_id)
        running = self.running.setdefault(key, Running())
        running.requests += 1
        try:
            async with running.lock:
                outcome = await action.run(client, subject_id)
        finally:
            running.requests -= 1
            if not running.requests:
                del self.running[key]
        log.info("console: %s", outcome.summary)
        raise web.HTTPSeeOther(subject.page(subject_id) + "&" + _query(**outcome.params))


def _csrf_action(subject: Subject, action: Action) -> str:
    """What a CSRF token is bound to besides the cookie and the subject's id: the kind of
    subject and the action, so a token for one never passes for another."""
    return f"{subject.kind}:{action.name}"


def _query(**items: object) -> str:
    return urlencode({k: str(v) for k, v in items.items()})


def _int_param(raw: str | None, name: str) -> int:
    if raw is None or not raw.lstrip("-").isdigit():
        raise web.HTTPBadRequest(text=f"{name}: expected an integer, got {raw!r}")
    return int(raw)


async def serve(settings: Settings, *, host: str, port: int, behind_ms: int,
                stop: asyncio.Event, started: Callable[[int], None] | None = None) -> None:
    """Run the console until `stop` is set; `started` gets the bound port."""
    from chronowheel.ops.cluster import open_store, recorded_shards

    token = settings.console_token
    check_bind(host, token)
    store = await open_store(settings)
    runner: web.AppRunner | None = None
    sources: Sources | None = None
    try:
        shards = await recorded_shards(store, settings)
        sources = Sources(settings, store, shards, behind_ms=behind_ms)
        await sources.start()
        console = Console(sources, Guard.create(token, host), namespace=settings.namespace,
                          client=lambda: SchedulerClient(settings, store=store))
        runner = web.AppRunner(console.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = port
        for address in runner.addresses:  # (host, port, ...) of every listening socket
            bound = int(address[1])
        log.info("console for namespace %s on http://%s:%d/ (actions %s)", settings.namespace,
                 host if ":" not in host else f"[{host}]", bound,
                 "enabled" if token is not None else "disabled: no token")
        if started is not None:
            started(bound)
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()
        if sources is not None:
            await sources.stop()
        await asyncio.to_thread(store.close)

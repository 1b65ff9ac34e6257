"""HTML of the console's pages: pure functions of the data, every value escaped.

Styles and scripts are inline and carry the response's CSP nonce; nothing is fetched from
another origin. Each page works without scripts; the scripts only add the live refresh of the
overview and the drawing of the heat map (whose numbers are also in tables below it).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import orjson

from chronowheel.console.actions import (
    JOBS,
    LETTERS,
    Action,
    Preview,
    Subject,
    job_href,
)
from chronowheel.console.sources import ClusterView, DuePage, HeatMap, JobView, RedriveState
from chronowheel.core import wire
from chronowheel.core.buckets import MINUTE_MS
from chronowheel.core.runs import JobHistory, shown_status
from chronowheel.ops.format import count, human_ms, relative, rfc3339

NAV = (("cluster", "/", "Cluster"), ("upcoming", "/upcoming", "Upcoming load"),
       ("jobs", "/jobs", "Jobs"), ("rejected", "/rejected", "Rejected"),
       ("dead", "/dead", "Dead letters"))

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1f2a37;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfd8e3;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .ns{margin-left:auto;font-family:monospace}
main{padding:12px 16px}h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d5dae1;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5}td.n{text-align:right}.bad{color:#b42318;font-weight:600}
.ok{color:#067647}.muted{color:#667085}pre{background:#fff;border:1px solid #d5dae1;
padding:8px;overflow:auto;max-width:100%}code{font-family:ui-monospace,monospace}
.btn{display:inline-block;padding:5px 12px;border:1px solid #98a2b3;border-radius:4px;
background:#fff;color:#1b1f24;text-decoration:none;cursor:pointer;font:inherit}
.btn.danger{border-color:#b42318;color:#b42318}.btn[disabled]{opacity:.5;cursor:not-allowed}
.note{background:#fff;border-left:4px solid
#2e90fa;padding:6px 10px;margin:8px 0}.warn{border-left-color:#f79009}
#heat{border:1px solid #d5dae1;background:#fff;cursor:crosshair;image-rendering:pixelated}
.scroll{overflow-x:auto;max-width:100%}.legend span{display:inline-block;width:14px;height:10px}
.legend .l-none{background:#f2f4f7}
"""
# The heat map's colour at a fraction t of the (log) maximum: hue 210 -> 0, lightness 85 -> 40;
# the same formula as the drawing script (CSP allows no style attributes, hence classes).
LEGEND_STEPS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
STYLE += "".join(
    f".legend .l{i}{{background:hsl({round(210 - 210 * t)},90%,{round(85 - 45 * t)}%)}}"
    for i, t in enumerate(LEGEND_STEPS))


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def page(*, title: str, active: str, namespace: str, nonce: str, body: str,
         script: str = "") -> str:
    nav = "".join(f'<a href="{href}"{" class=on" if key == active else ""}>{esc(label)}</a>'
                  for key, href, label in NAV)
    tail = f'<script nonce="{nonce}">{script}</script>' if script else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<link rel="icon" href="data:,">'
            f'<title>{esc(title)} · chronowheel {esc(namespace)}</title>'
            f'<style nonce="{nonce}">{STYLE}</style></head><body>'
            f'<header><strong>chronowheel</strong>{nav}<span class="ns">namespace '
            f'{esc(namespace)}</span></header><main>{body}</main>{tail}</body></html>')


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = (),
          attrs: str = "") -> str:
    """Cells are HTML already (callers escape values)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{cell}</td>'
                         for i, cell in enumerate(row)) + "</tr>"
        for row in rows)
    return f"<table {attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def when(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return '<span class="muted">-</span>'
    return f'<span title="{esc(relative(ms, now_ms))}">{esc(rfc3339(ms))}</span>'


def job_link(job_id: str) -> str:
    return f'<a href="{esc(job_href(job_id))}">{esc(job_id)}</a>'


# --- cluster ---------------------------------------------------------------------------------

def cluster_fragment(view: ClusterView) -> str:
    now = view.now_ms
    skew = view.console_skew_ms
    if skew is None:
        skew_html = '<span class="muted">not measured yet</span>'
    else:
        over = abs(skew) - (view.console_skew_uncertainty_ms or 0) > view.max_clock_skew_ms
        cls = "bad" if over else "ok"
        skew_html = (f'<span class="{cls}" id="skew-state">{esc(human_ms(skew))} '
                     f'(±{esc(human_ms(view.console_skew_uncertainty_ms or 0))}; nodes stop '
                     f'dispatching beyond {esc(human_ms(view.max_clock_skew_ms))})</span>')
    behind = [r for r in view.rows if r.lag_ms is not None]
    unowned = [r for r in view.rows if r.owner is None]
    summary = [
        f"<b>{view.shards}</b> shards, <b>{len(view.nodes)}</b> node(s), group "
        f"<b>{esc(view.group_state)}</b>",
        f'<span class="{"bad" if behind else "ok"}" id="behind">{len(behind)} shard(s) behind '
        f"(lag &gt; {esc(human_ms(view.behind_ms))})</span>",
        f'<span class="{"bad" if unowned else "ok"}">{len(unowned)} unowned</span>',
        f"last transaction {when(view.last_commit_ms, now)}",
        f"this console's clock minus Cassandra's: {skew_html}",
    ]
    nodes = table(
        ["Node", "Shards", "Last transaction", "Clock skew"],
        [[esc(n.label), esc(",".join(map(str, n.shards)) or "-"), when(n.last_commit_ms, now),
          node_clock(n.skew_ms, n.blocked)] for n in view.nodes],
        attrs='id="nodes"') if view.nodes else '<p class="bad">No node is running.</p>'
    rows = []
    for r in view.rows:
        rec = view.records.get(r.shard)
        lag = (f'<span class="bad">{esc(human_ms(r.lag_ms))}</span>'
               if r.lag_ms is not None else '<span class="ok">ok</span>')
        rows.append([
            str(r.shard), esc(r.owner) if r.owner else '<span class="bad">(none)</span>',
            esc(r.writer or "-"), when(r.watermark_ms, now),
            "-" if r.watermark_age_ms is None else esc(human_ms(r.watermark_age_ms)),
            lag,
            "-" if r.horizon_ahead_ms is None else esc(
                ("+" if r.horizon_ahead_ms >= 0 else "") + human_ms(r.horizon_ahead_ms)),
            "-" if r.wheel is None else count(r.wheel),
            count(r.due_rows),
            when(rec.at if rec else None, now),
        ])
    shards = table(["Shard", "Owner", "Last writer", "Watermark", "Age", "Dispatch lag",
                    "Horizon", "Wheel", "Due 10 min", "Last transaction"], rows,
                   numeric=(0, 4, 5, 6, 7, 8), attrs='id="shards"')
    return (f'<p>{" · ".join(summary)}</p><p class="muted">as of {esc(rfc3339(now))}</p>'
            f"<h2>Nodes</h2>{nodes}<h2>Shards</h2>{shards}"
            '<p class="muted">Watermark: every occurrence due up to it is published. Age: how '
            "old the newest committed watermark is (an idle shard commits every 2 s). Horizon: "
            "how far ahead of now the wheel is loaded. Due: rows written into the next 10 "
            "minute buckets (cancelled or fired rows still count).</p>")


def node_clock(skew_ms: int | None, blocked: bool | None) -> str:
    if blocked:
        shown = "" if skew_ms is None else f" ({esc(human_ms(skew_ms))})"
        return f'<span class="bad">dispatch stopped{shown}</span>'
    if skew_ms is None:
        return '<span class="muted">not reported</span>'
    return f'<span class="ok">{esc(human_ms(skew_ms))}, dispatching</span>'


CLUSTER_SCRIPT = """
(function(){var box=document.getElementById('live');var busy=false;
setInterval(function(){if(busy||document.hidden)return;busy=true;
fetch('/cluster/fragment',{credentials:'same-origin'}).then(function(r){
if(r.ok)return r.text();throw new Error(r.status)}).then(function(t){box.innerHTML=t;
box.dataset.refreshed=String(Date.now())}).catch(function(){}).finally(function(){busy=false})},
2000)})();
"""


def cluster_page(view: ClusterView, *, namespace: str, nonce: str) -> str:
    body = (f'<h1>Cluster</h1><div id="live" data-refreshed="0">{cluster_fragment(view)}</div>')
    return page(title="Cluster", active="cluster", namespace=namespace, nonce=nonce,
                body=body, script=CLUSTER_SCRIPT)


# --- upcoming load ---------------------------------------------------------------------------

HEAT_SCRIPT = """
(function(){var d=JSON.parse(document.getElementById('heat-data').textContent);
var c=document.getElementById('heat'),g=c.getContext('2d'),S=d.counts.length,M=d.minutes;
var cw=d.cell_w,ch=d.cell_h,X=d.x0,Y=d.y0,max=1;d.counts.forEach(function(r){r.forEach(
function(v){if(v>max)max=v})});var lm=Math.log(max+1);
function color(v){if(!v)return '#f2f4f7';var t=Math.log(v+1)/lm;
return 'hsl('+Math.round(210-210*t)+',90%,'+Math.round(85-45*t)+'%)'}
g.font='10px sans-serif';g.textBaseline='middle';
for(var s=0;s<S;s++){g.fillStyle='#667085';
if(ch>=8||s%4===0)g.fillText(String(s),2,Y+s*ch+ch/2);
var r=d.counts[s];for(var m=0;m<M;m++){g.fillStyle=color(r[m]);
g.fillRect(X+m*cw,Y+s*ch,cw,ch)}}
g.textBaseline='alphabetic';for(var m=0;m<M;m++){var t=d.first+m*60000;
if(t%3600000===0){var h=new Date(t).getUTCHours();g.fillStyle=h===0?'#b42318':'#98a2b3';
g.fillRect(X+m*cw,h%3===0?2:Y-5,1,h%3===0?Y-2:5);g.fillStyle='#1b1f24';
if(h%3===0)g.fillText((h<10?'0':'')+h+':00',X+m*cw+3,10)}}
var tip=document.getElementById('heat-tip');
function at(e){var b=c.getBoundingClientRect();var m=Math.floor((e.clientX-b.left-X)/cw),
s=Math.floor((e.clientY-b.top-Y)/ch);if(m<0||m>=M||s<0||s>=S)return null;return [m,s]}
c.addEventListener('mousemove',function(e){var p=at(e);if(!p){tip.textContent='';return}
var t=new Date(d.first+p[0]*60000).toISOString().slice(0,16)+'Z';
tip.textContent=t+' shard '+p[1]+': '+d.counts[p[1]][p[0]]+' rows'});
c.addEventListener('click',function(e){var p=at(e);if(!p)return;
location.href='/upcoming/minute?m='+(d.first+p[0]*60000)+'&shard='+p[1]});
c.dataset.drawn='1'})();
"""


# Canvas geometry: a pixel per minute, a left margin for the shard numbers, a top strip for
# the hour ticks (a red tick at midnight UTC).
HEAT_CELL_W, HEAT_X0, HEAT_Y0 = 1, 22, 14


def heat_page(hm: HeatMap, *, namespace: str, nonce: str, now_ms: int,
              elapsed_ms: float, read_at_ms: int | None = None) -> str:
    shards = len(hm.counts)
    cell_w, cell_h = HEAT_CELL_W, max(4, min(14, 280 // max(1, shards)))
    data = {"first": hm.first_minute, "minutes": hm.minutes, "counts": hm.counts,
            "cell_w": cell_w, "cell_h": cell_h, "x0": HEAT_X0, "y0": HEAT_Y0}
    # orjson escapes nothing for HTML: "</" must not end the script element early.
    blob = orjson.dumps(data).decode().replace("</", "<\\/")
    busiest = hm.busiest(15)
    top = table(["Minute (UTC)", "Rows", ""],
                [[esc(rfc3339(m)), count(n),
                  f'<a href="/upcoming/minute?m={m}">rows</a>'] for m, n in busiest],
                numeric=(1,), attrs='id="busiest"') if busiest else \
        '<p class="muted">Nothing is due in the next 24 hours.</p>'
    hours = table(["Hour (UTC)", "Rows"],
                  [[esc(rfc3339(h)[:13] + ":00Z"), count(n)] for h, n in hm.hour_totals()],
                  numeric=(1,), attrs='id="hours"')
    legend = "".join(f'<span class="l{i}"></span>' for i in range(len(LEGEND_STEPS)))
    body = (
        f"<h1>Upcoming load</h1><p>Rows per minute bucket and shard for the next 24 hours "
        f"from {esc(rfc3339(hm.first_minute))}: <b id=\"heat-total\">{count(hm.total)}</b> "
        f"rows. Read from <code>bucket_counts</code> in {elapsed_ms:.0f} ms"
        f"{'' if read_at_ms is None else ', ' + esc(relative(read_at_ms, now_ms))}. Rows are "
        f"counted when written, so cancelled and already fired rows still count.</p>"
        f'<p class="legend muted">none <span class="l-none"></span> few {legend} many '
        f"(log scale; a pixel per minute, a band per shard; hour ticks on top, red at "
        f'midnight UTC; click a cell for its rows)</p><div class="scroll"><canvas id="heat" '
        f'width="{HEAT_X0 + hm.minutes * cell_w}" height="{HEAT_Y0 + shards * cell_h}" '
        f'data-drawn="0"></canvas></div>'
        f'<p id="heat-tip" class="muted">&nbsp;</p>'
        f'<script type="application/json" id="heat-data">{blob}</script>'
        f"<h2>Busiest minutes</h2>{top}<h2>Hourly totals</h2>{hours}")
    return page(title="Upcoming load", active="upcoming", namespace=namespace, nonce=nonce,
                body=body, script=HEAT_SCRIPT)


def minute_page(due: DuePage, *, namespace: str, nonce: str, now_ms: int,
                counts: Sequence[int] | None) -> str:
    where = "all shards" if due.shard is None else f"shard {due.shard}"
    rows = [[job_link(r.job_id), str(r.shard), when(r.slot_ms, now_ms),
             when(r.scheduled_ms, now_ms), str(r.attempt), esc(r.topic),
             count(len(r.payload))] for r in due.rows]
    listing = table(["Job", "Shard", "Slot (fires at)", "Scheduled", "Attempt", "Topic",
                     "Payload bytes"], rows, numeric=(1, 4, 6), attrs='id="due-rows"') \
        if rows else '<p class="muted">No rows (they may have expired or never existed).</p>'
    pager = ""
    if due.next_cursor:
        q = {"m": str(due.minute), "after": due.next_cursor}
        if due.shard is not None:
            q["shard"] = str(due.shard)
        pager = f'<p><a class="btn" id="next-page" href="/upcoming/minute?{urlencode(q)}">Next ' \
                f"page</a></p>"
    per_shard = ""
    if counts is not None:
        per_shard = "<h2>Counted rows per shard</h2>" + table(
            ["Shard", "Rows"],
            [[f'<a href="/upcoming/minute?m={due.minute}&amp;shard={k}">{k}</a>', count(n)]
             for k, n in enumerate(counts) if n], numeric=(0, 1))
    body = (f"<h1>Due rows of {esc(rfc3339(due.minute))} ({esc(where)})</h1>"
            f'<p><a href="/upcoming/minute?m={due.minute - MINUTE_MS}">&larr; previous '
            f'minute</a> · <a href="/upcoming/minute?m={due.minute + MINUTE_MS}">next minute '
            f'&rarr;</a> · <a href="/upcoming/minute?m={due.minute}">all shards</a></p>'
            f"{listing}{pager}{per_shard}")
    return page(title="Due rows", active="upcoming", namespace=namespace, nonce=nonce,
                body=body)


# --- jobs ------------------------------------------------------------------------------------

def lookup_form(value: str = "") -> str:
    return ('<form method="get" action="/jobs" class="lookup"><label>Job id <input name="id" '
            f'size="48" value="{esc(value)}" required></label> <button class="btn" '
            'type="submit">Look up</button></form>')


def jobs_page(*, namespace: str, nonce: str, message: str = "", value: str = "") -> str:
    body = f"<h1>Jobs</h1>{lookup_form(value)}{message}"
    return page(title="Jobs", active="jobs", namespace=namespace, nonce=nonce, body=body)


def zoned(ms: int, tz: str) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).isoformat(timespec="seconds")
    except (KeyError, ValueError):
        return rfc3339(ms)


def job_page(view: JobView, *, namespace: str, nonce: str, now_ms: int,
             actions: Sequence[Action], notice: str = "") -> str:
    row = view.row
    published = ""
    if row.status == "scheduled" and row.slot_ms is not None and view.watermark_ms is not None:
        published = ("yes (the shard's watermark is past it)" if row.slot_ms <= view.watermark_ms
                     else "not yet")
    history = view.history
    last = history.runs[0] if history is not None and history.runs else None
    recurring = isinstance(view.spec, dict) and ("cron" in view.spec or "every" in view.spec)
    status = shown_status(row.status, recurring=recurring, scheduled_ms=row.scheduled_ms,
                          last=last)
    facts = table(["Field", "Value"], [
        ["Id", f"<code>{esc(row.job_id)}</code>"],
        ["Status", f'<b id="job-status">{esc(status)}</b>'
                   + (f' <span class="muted">(stored: {esc(row.status)}; its occurrence has '
                      f"run)</span>" if status != row.status else "")],
        *([["Note", f'<span id="job-note">{esc(row.note)}</span>']] if row.note else []),
        ["Version", str(row.version)],
        ["Shard", str(row.shard)],
        ["Next scheduled", when(row.scheduled_ms, now_ms)],
        ["Slot (effective firing instant)", when(row.slot_ms, now_ms)],
        ["Published", esc(published or "-")],
        ["Target topic", f"<code>{esc(view.target_topic)}</code>"],
        ["Time zone", esc(view.tz)],
    ], attrs='id="job-facts"')
    if view.preview_problem:
        nexts = f'<p class="bad">No preview: {esc(view.preview_problem)}</p>'
    elif view.next_occurrences:
        nexts = table([f"In {view.tz}", "UTC", ""],
                      [[esc(zoned(ms, view.tz)), esc(rfc3339(ms)), esc(relative(ms, now_ms))]
                       for ms in view.next_occurrences], attrs='id="next-occurrences"')
    else:
        nexts = '<p class="muted">No further occurrence.</p>'
    if view.previous_occurrence is not None:
        nexts += (f'<p class="muted">Latest scheduled instant at or before now: '
                  f"{esc(zoned(view.previous_occurrence, view.tz))}</p>")
    fired = table(["Scheduled", "Fired", "Late by", "Attempt", "Partition@offset"], [
        [when(f.scheduled_ms, now_ms), when(f.fired_ms, now_ms),
         "-" if f.scheduled_ms is None or f.fired_ms is None
         else esc(human_ms(f.fired_ms - f.scheduled_ms)),
         esc(f.attempt or "-"), f"{f.partition}@{f.offset}"] for f in view.fired],
        attrs='id="fired"') if view.fired else '<p class="muted">None found.</p>'
    runs = runs_section(history, now_ms)
    spec = orjson.dumps(view.spec, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() \
        if view.spec is not None else row.spec.decode("utf-8", "replace")
    buttons = " ".join(
        f'<a class="btn{" danger" if a.danger else ""}" id="action-{esc(a.name)}" '
        f'href="{esc(JOBS.confirm_href(row.job_id, a.name))}">{esc(a.label)}</a>'
        for a in actions) if row.status == "scheduled" else ""
    body = (f"<h1>Job {esc(row.job_id)}</h1>{notice}{lookup_form()}"
            f"<p>{buttons}</p>{facts}"
            f"<h2>Next occurrences</h2>{nexts}"
            f"<h2>Runs</h2>{runs}"
            f"<h2>Last fired occurrences</h2><p class=\"muted\">From the last "
            f"{count(view.fired_scanned)} messages of the job's partition of "
            f"<code>{esc(view.target_topic)}</code>.</p>{fired}"
            f"<h2>Spec</h2><pre id=\"spec\">{esc(spec)}</pre>")
    return page(title=f"Job {row.job_id}", active="jobs", namespace=namespace, nonce=nonce,
                body=body)


def runs_section(history: JobHistory | None, now_ms: int) -> str:
    """A job's counters and last runs (newest first), as `chronowheel job history` shows
    them."""
    if history is None:
        return '<p class="muted">Not read.</p>'
    c = history.counters
    counters = table(["Fired", "Succeeded", "Failed", "Dead-lettered", "Skipped", "Missed",
                      "Last outcome"],
                     [[str(c.fired), str(c.succeeded), str(c.failed), str(c.dead_lettered),
                       str(c.skipped), str(c.missed), esc(c.last_outcome or "-")]],
                     attrs='id="run-counters"')
    if not history.runs:
        return counters + '<p class="muted">No runs recorded.</p>'
    rows = [[when(r.scheduled_ms, now_ms), esc(r.attempt), f"<b>{esc(r.state)}</b>",
             when(r.fired_ms, now_ms),
             "-" if r.lateness_ms is None else esc(human_ms(r.lateness_ms)),
             esc(r.node_id or "-"), when(r.started_ms, now_ms),
             "-" if r.duration_ms is None else esc(human_ms(r.duration_ms)),
             esc(r.worker_id or "-"), esc(r.error or "-")] for r in history.runs]
    return counters + table(["Scheduled", "Attempt", "State", "Fired", "Late by", "Node",
                             "Handler start", "Took", "Worker", "Error"], rows,
                            attrs='id="runs"')


def confirm_page(action: Action, subject_id: str, *, namespace: str, nonce: str, csrf: str,
                 subject: Subject = JOBS, preview: Preview | None = None) -> str:
    """The question, what will be sent, and the form that POSTs it with its CSRF token (no
    form when the preview says nothing would be sent)."""
    back = f'<a class="btn" href="{esc(subject.page(subject_id))}">Back</a>'
    shown = ""
    if preview is not None:
        shown = (f'<p id="preview" class="note{"" if preview.sendable else " warn"}">'
                 f"{esc(preview.message)}</p>")
        if preview.command is not None:
            shown += f'<pre id="preview-command">{esc(preview.command)}</pre>'
    if preview is not None and not preview.sendable:
        return page(title=action.label, active=subject.active, namespace=namespace,
                    nonce=nonce, body=f"<h1>{esc(action.confirm.format(id=subject_id))}</h1>"
                                      f"{shown}<p>{back}</p>")
    body = (f"<h1>{esc(action.confirm.format(id=subject_id))}</h1><p>{esc(action.effect)}</p>"
            f"{shown}"
            f'<form method="post" action="{esc(subject.path)}/action" id="confirm-form">'
            f'<input type="hidden" name="id" value="{esc(subject_id)}">'
            f'<input type="hidden" name="action" value="{esc(action.name)}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<button class="btn{" danger" if action.danger else ""}" type="submit" '
            f'id="confirm">{esc(action.label)}</button> {back}</form>')
    return page(title=action.label, active=subject.active, namespace=namespace, nonce=nonce,
                body=body)


def sent_notice(action: Action, topic: str, partition: int, offset: int) -> str:
    return (f'<p class="note" id="notice">{esc(action.label)}: command written to '
            f"{esc(topic)} partition {partition} offset {offset}. The status changes once the "
            "owning node applies it.</p>")


# --- tails -----------------------------------------------------------------------------------

def tail_page(*, topic: str, messages: Sequence[dict[str, Any]], reason_header: str,
              active: str, title: str, namespace: str, nonce: str, now_ms: int,
              redrive: Mapping[str, RedriveState] | None = None, actions: bool = False,
              notice: str = "") -> str:
    """A topic's tail; with `redrive` (the dead letters', by `<partition>@<offset>`) a column
    saying what `chronowheel dead redrive` would do with each letter, and for a letter it
    would send a Redrive button (disabled unless `actions`: the console has a token)."""
    rows = []
    for m in messages:
        headers = m["headers"]
        payload = m.get("payload", m.get("payload_text", m.get("payload_b64")))
        shown = {k: v for k, v in headers.items() if k != reason_header}
        position = f"{m['partition']}@{m['offset']}"
        row = [
            when(m["timestamp_ms"], now_ms),
            f'<b class="reason">{esc(headers.get(reason_header, "-"))}</b>',
            job_link(m["key"]) if m["key"] else '<span class="muted">(no key)</span>',
            f"<code>{esc(' '.join(f'{k}={v}' for k, v in shown.items()))}</code>",
            f"<code>{esc(_short(orjson.dumps(payload).decode()))}</code>",
            position,
        ]
        if redrive is not None:
            row.append(redrive_cell(redrive.get(position), headers.get(wire.JOB_ID),
                                    namespace, position=position, actions=actions))
        rows.append(row)
    heads = ["Time", "Reason", "Key", "Headers", "Payload", "Partition@offset"]
    if redrive is not None:
        heads.append("Redrive")
    listing = table(heads, rows, attrs='id="tail"') if rows \
        else '<p class="muted">No messages.</p>'
    explained = "" if redrive is None else (
        "<p>Redrive says what <code>chronowheel dead redrive</code> would do with each letter "
        "now (a dry run of its own code): <b>ready</b> sends it again as the next attempt of "
        "its occurrence, <b>redriven</b> was sent before and is not sent again, "
        "<b>refused</b> cannot be, with the reason. The <b>Redrive</b> button of a ready "
        "letter redrives that one letter, after a confirmation page (it needs the console's "
        "token); the command line selects by job, tenant, failure time or reason; start "
        "with <code>--dry-run</code> (docs/worker.md).</p>")
    body = (f"<h1>{esc(title)}</h1>{notice}<p>The newest committed messages of <code>"
            f"{esc(topic)}</code> (read_committed; the last {count(50)} of each partition), "
            f"newest first; the reason is the <code>{esc(reason_header)}</code> header.</p>"
            f"{explained}{listing}")
    return page(title=title, active=active, namespace=namespace, nonce=nonce, body=body)


def redrive_cell(state: RedriveState | None, job_id: str | None, namespace: str, *,
                 position: str = "", actions: bool = False) -> str:
    if state is None:
        return '<span class="muted">-</span>'
    kind, why = state
    if kind == "ready":
        command = (f"chronowheel dead redrive --namespace {shlex.quote(namespace)} --job "
                   f"{shlex.quote(job_id or '')} --dry-run")
        slug = position.replace("@", "-")
        if actions:
            button = (f'<a class="btn redrive-action" id="redrive-{esc(slug)}" '
                      f'href="{esc(LETTERS.confirm_href(position, "redrive"))}">Redrive</a>')
        else:
            button = (f'<button class="btn redrive-action" id="redrive-{esc(slug)}" '
                      f'type="button" disabled title="actions are disabled: start the console '
                      f'with CHRONOWHEEL_CONSOLE_TOKEN set">Redrive</button>')
        return (f'<span class="redrive ok">ready</span> {button}<br>'
                f"<code>{esc(command)}</code>")
    if kind == "redriven":
        return '<span class="redrive muted">redriven</span>'
    return f'<span class="redrive bad">refused</span>: {esc(why or "")}'


def redrive_notice(position: str, outcome: str, topic: str) -> str:
    """What the redrive of the letter at `position` did (`actions.REDRIVE_OUTCOMES`)."""
    text = {
        "redriven": f"Dead letter {position} redriven: its retry command was written to "
                    f"{topic} and its request id redrive:{position} recorded; it is not sent "
                    f"again.",
        "already": f"Dead letter {position} was redriven before: nothing was sent.",
        "refused": f"Dead letter {position} cannot be redriven: nothing was sent (its Redrive "
                   f"column says why).",
        "missing": f"There is no dead letter at {position}: nothing was sent.",
    }[outcome]
    cls = "note" if outcome == "redriven" else "note warn"
    return f'<p class="{cls}" id="notice">{esc(text)}</p>'


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def error_page(status: int, message: str, *, namespace: str, nonce: str) -> str:
    body = f"<h1>{status}</h1><p>{esc(message)}</p>"
    return page(title=str(status), active="", namespace=namespace, nonce=nonce, body=body)


REASON_HEADERS = {"rejected": wire.REASON, "dead": wire.ERROR}

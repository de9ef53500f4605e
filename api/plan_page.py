"""``GET /v1/plans/{id}/view``: one server-rendered HTML page per stored plan.

No build step and no scripts: the summary, the cost per node with the runner-up of every
choice, what makes the memory peak, the tables by tensor, the overview chart (cost per
node, key residency, modelled memory) and the layout pictures (PNG data URIs), and the
legend of the layout notation.  The runner-ups and the layouts of intermediate values are
re-derived by planning the plan's embedded graph again (:mod:`planner.report.explain`), unless
the plan carries ``explain``.

That re-planning is real planning work, so the server never renders a page itself: the
planning service (:meth:`api.rest_jobs.PlanService.page`) renders it in a planning worker
under the request limits (wall time, worker memory), once per plan (concurrent views
share one render), and caches the page and the explanations in the plan store.  The page
is rendered with :data:`PLAN_ID_PLACEHOLDER` where the plan id goes, and each owner is
served it with the id they know (:func:`with_plan_id`).

Hooked into the REST app by :func:`register` (one call in ``api.rest.create_app``), which
also adds ``Link: </v1/plans/{id}/view>; rel="view"`` to every response that carries a
plan id (``x-slotplan-plan-id``), so the REST answer points at its page.
"""

from __future__ import annotations

import base64
import html
import re
import tempfile
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from api.show import (
    LEGEND,
    NODE_FIELDS,
    SHOWN_PARAMS,
    VIZ_HINT,
    _fmt_bytes,
    have_matplotlib,
    layout_views,
    node_numbers,
    peak_breakdown,
    render_layouts,
    render_png,
    table_sizes,
)
from common.errors import SlotplanError
from planner.frontend.params import insecure_line

VIEW_PATH = "/v1/plans/{plan_id}/view"
_ID_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_LAYOUTS = 12  # layout pictures per page (said on the page when there are more)
MAX_CT = 4  # ciphertexts drawn per layout
PLAN_ID_PLACEHOLDER = "@@SLOTPLAN-PLAN-ID@@"
# the page has no scripts and only inline styles and data: images
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
th{background:#eef}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f6f6;padding:.8em;font-size:.8em;overflow-x:auto}img{max-width:100%;border:1px solid #ddd}
.reason{font-size:.85em;color:#444}.note{color:#a40}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def _png_uri(draw: Callable[[Path], Path]) -> str:
    with tempfile.TemporaryDirectory(prefix="slotplan-page-") as d:
        data = draw(Path(d) / "f.png").read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def render_page(plan_id: str, plan: Mapping[str, Any]) -> str:
    """The HTML page of a plan (deterministic for a given plan)."""
    return render_page_and_explain(plan_id, plan)[0]


def with_plan_id(page: str, plan_id: str) -> str:
    """A page rendered with :data:`PLAN_ID_PLACEHOLDER`, naming ``plan_id`` (64 hex digits)."""
    assert _ID_RE.match(plan_id)
    return page.replace(PLAN_ID_PLACEHOLDER, plan_id)


def render_page_and_explain(plan_id: str, plan: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The HTML page of a plan and the explanations it shows (None when unavailable)."""
    from planner.report.explain import ExplainError, explain_choices, replan

    s = plan["summary"]
    name = f"{plan['graph']['name']} @ {plan['params'].get('name', '?')}"
    replanned = None
    note = ""
    try:
        replanned = replan(plan)
    except (ExplainError, SlotplanError) as e:
        note = str(e)
    ex = plan.get("explain")
    if ex is None and replanned is not None:
        ex = explain_choices(*replanned)
    reasons = {n["id"]: n for n in (ex or {}).get("nodes", [])}

    parts: list[str] = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>slotplan: {_e(name)}</title><style>{_CSS}</style></head><body>",
        f'<h1 id="title">{_e(name)} ({_e(plan["params"]["slots"])} slots)</h1>',
        f'<p>plan <code>{_e(plan_id)}</code> &middot; <a href="/v1/plans/{_e(plan_id)}">JSON</a> &middot; '
        f'<a href="/v1/plans/{_e(plan_id)}/tables">tables (npz)</a></p>',
    ]
    # summary
    pk = s["peak_bytes"]
    solver = s.get("solver", {})
    rows = [("nodes", len(plan["nodes"])), ("instructions", len(plan["program"])),
            ("rotations", s["rotations"]), ("rotation keys", s["rotation_keys"]), ("key loads", s["key_loads"]),
            ("pmul", s["pmul"]), ("cmul", s.get("cmul", 0)), ("depth", s["depth"]),
            ("modelled peak", f"{_fmt_bytes(pk['total'])} (keys {_fmt_bytes(pk['keys'])}, plaintexts "
                              f"{_fmt_bytes(pk['plaintexts'])}, ciphertexts {_fmt_bytes(pk['ciphertexts'])})"),
            ("memory cap", _fmt_bytes(s["memory_cap_bytes"]) if s.get("memory_cap_bytes") else "none"),
            ("solver", f"{solver.get('name')}: {solver.get('status')}, objective {solver.get('objective')}")]
    if s.get("insecure"):
        parts.append('<p id="insecure" class="note"><strong>Insecure parameters:</strong> '
                     f"{_e(insecure_line(plan['params']) or 'below the 128-bit bound')}</p>")
    parts.append('<section id="summary"><h2>Summary</h2><table>')
    parts += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows]
    parts.append("</table></section>")

    # nodes
    parts.append('<section id="nodes"><h2>Cost per node and why each kernel</h2>')
    if ex is None:
        parts.append(f'<p class="note">runner-ups not available: {_e(note)}</p>')
    else:
        parts.append(f"<p>Objective {_e(ex.get('objective'))} {_e(ex.get('unit'))}s (cost table "
                     f"{_e(ex.get('costs'))}). Numbers per node as the plan's <code>nodes</code> report them; "
                     "the reason compares the chosen option with the runner-up, both including the conversions "
                     "on the node's edges.</p>")
    cols = ["node", "op", "kernel", "params", *NODE_FIELDS[:4], "depth", "conversions", "out layout", "why"]
    parts.append('<table id="node-table"><tr>' + "".join(f"<th>{_e(c)}</th>" for c in cols) + "</tr>")
    for n in plan["nodes"]:
        nums = node_numbers(n)
        params = ", ".join(f"{k}={v}" for k, v in n.get("params", {}).items() if k in SHOWN_PARAMS)
        conv = ", ".join(f"{c['operand']}: {c['kind']}" for c in n.get("conversions", [])) or "-"
        why = reasons.get(n["id"], {}).get("reason", "")
        cells = [n["id"], n.get("op", ""), n["kernel"], params]
        parts.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells)
                     + "".join(f'<td class="n">{_e(nums.get(f, "-"))}</td>' for f in (*NODE_FIELDS[:4], "depth"))
                     + f"<td>{_e(conv)}</td><td><code>{_e(n.get('out_layout', ''))}</code></td>"
                     + f'<td class="reason">{_e(why)}</td></tr>')
    parts.append("</table></section>")

    # memory and tables
    bd = peak_breakdown(plan)
    parts.append(f'<section id="memory"><h2>Memory at the modelled peak: {_e(_fmt_bytes(bd.total))} '
                 f"(program step {bd.step}, {_e(bd.op)})</h2>")
    parts.append('<table id="peak-breakdown"><tr><th>what</th><th>count</th><th>each</th><th>level</th>'
                 "<th>bytes</th></tr>")
    for what, items in (("rotation keys", bd.keys), ("ciphertexts", bd.ciphertexts), ("plaintexts", bd.plaintexts)):
        for lv, cnt, each in items:
            level = lv if isinstance(lv, str) else f"level {lv}"
            parts.append(f"<tr><td>{what}</td><td class=n>{cnt}</td><td class=n>{_e(_fmt_bytes(each))}</td>"
                         f"<td>{_e(level)}</td><td class=n>{_e(_fmt_bytes(cnt * each))}</td></tr>")
    parts.append("</table>")
    if not bd.scheduled:
        parts.append("<p>No key schedule: every rotation key the program uses is resident for the whole program "
                     "(plan with a memory cap to load and drop keys).</p>")
    groups = table_sizes(plan)
    parts.append('<h2>Tables by tensor</h2><p>The tables file (one int64 index per slot and table; not part '
                 'of the resident memory):</p><table id="table-sizes"><tr><th>tensor</th><th>role</th>'
                 "<th>tables</th><th>bytes (indices)</th></tr>")
    parts += [f"<tr><td>{_e(g.tensor)}</td><td>{_e(g.role)}</td><td class=n>{g.tables}</td>"
              f"<td class=n>{_e(_fmt_bytes(g.bytes))}</td></tr>" for g in groups]
    parts.append("</table></section>")

    # charts (matplotlib is the optional `viz` extra: without it the page says so)
    if not have_matplotlib():
        parts.append('<section id="charts"><h2>Cost per node, key residency, modelled memory</h2>'
                     f'<p class="note">charts not available: the server {_e(VIZ_HINT)}</p></section>')
    else:
        uri = _png_uri(lambda p: render_png(plan, p))
        parts.append('<section id="charts"><h2>Cost per node, key residency, modelled memory</h2>'
                     f'<img id="overview-chart" alt="cost per node, key residency and memory over the program" '
                     f'src="{uri}"></section>')

    # layouts
    parts.append('<section id="layouts"><h2>Layouts: which tensor element sits in which slot</h2>')
    if not have_matplotlib():
        parts.append(f'<p class="note">layout pictures not available: the server {_e(VIZ_HINT)}</p>')
    elif replanned is None:
        parts.append(f'<p class="note">layout pictures not available: {_e(note)}</p>')
    else:
        views = layout_views(plan, None, None, replanned)
        if len(views) > MAX_LAYOUTS:
            parts.append(f"<p>showing the first {MAX_LAYOUTS} of {len(views)} layouts "
                         "(<code>slotplan show PLAN --layout NAME --png F.png</code> draws any of them)</p>")
        for i, v in enumerate(views[:MAX_LAYOUTS]):
            src = _png_uri(lambda p, v=v: render_layouts([v], p, max_ct=MAX_CT))  # type: ignore[misc]
            parts.append(f'<figure><img id="layout-{i}" class="layout" alt="{_e(v.name)}: {_e(v.notation)}" '
                         f'src="{src}"><figcaption>{_e(v.name)} ({_e(v.kind)}): <code>{_e(v.notation)}'
                         "</code></figcaption></figure>")
    parts.append("</section>")
    parts.append(f'<section id="legend"><h2>Legend</h2><pre>{_e(LEGEND)}</pre></section>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n", (dict(ex) if ex is not None else None)


class ViewLinkMiddleware:
    """Adds ``Link: </v1/plans/{id}/view>; rel="view"`` to responses naming a plan id."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return

        async def send_wrapper(msg: Any) -> None:
            if msg.get("type") == "http.response.start":
                headers = list(msg.get("headers", []))
                pid = next((v for k, v in headers if k.lower() == b"x-slotplan-plan-id"), None)
                if pid is not None and _ID_RE.match(pid.decode("latin-1")):
                    link = f'</v1/plans/{pid.decode("latin-1")}/view>; rel="view"'.encode("latin-1")
                    headers.append((b"link", link))
                    msg = {**msg, "headers": headers}
            await send(msg)

        await self.app(scope, receive, send_wrapper)


_VIEW_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or wrong API key"},
    404: {"description": "no such plan (or another API key's)"},
    413: {"description": "rendering went over the service's wall-time or worker-memory limit"},
    421: {"description": "the Host header is not served here"},
    429: {"description": "over the rate limit; retry after Retry-After",
          "headers": {"Retry-After": {"schema": {"type": "integer"}}}},
    503: {"description": "busy; retry after Retry-After", "headers": {"Retry-After": {"schema": {"type": "integer"}}}},
}


def register(app: FastAPI) -> None:
    """Serve the plan page of the REST service's plans (``app.state.service``)."""
    router = APIRouter()

    @router.get(VIEW_PATH, response_class=HTMLResponse, summary="A stored plan as a web page",
                responses=_VIEW_RESPONSES)
    async def view_plan(plan_id: str, request: Request) -> Response:
        service = app.state.service
        if not _ID_RE.match(plan_id):
            return JSONResponse({"error": "not_found", "message": f"no plan {plan_id[:80]!r}: ids are 64 hex digits"},
                                status_code=404)
        state = request.state
        page = await service.page(plan_id, getattr(state, "owner", ""), getattr(state, "admin", False))
        if page is None:
            return JSONResponse({"error": "not_found", "message": f"no plan with id {plan_id}"}, status_code=404)
        request.state.plan_id = plan_id
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    app.include_router(router)
    app.add_middleware(ViewLinkMiddleware)  # type: ignore[arg-type]

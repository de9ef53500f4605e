"""Issue 17: the plan page ``GET /v1/plans/{id}/view``, in-process and in a real headless browser.

The browser test drives Debian's Chromium (``make test`` installs it with apt-get where it
can) against a uvicorn server on 127.0.0.1: the DOM Chromium builds must hold the page's
sections, and its screenshot must be a real picture (not blank)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from api.rest import RestLimits, create_app
from tests.helpers import REPO_ROOT

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

ROOT = REPO_ROOT
FAST = RestLimits(executor="thread", workers=2)
MLP = json.loads((ROOT / "data" / "workloads" / "keymemrt_mlp.json").read_text())
BODY = {"graph": MLP, "params": "n15", "options": {"time_limit_s": 10}}
PAGE_IDS = ("title", "summary", "nodes", "node-table", "memory", "peak-breakdown", "table-sizes", "charts",
            "overview-chart", "layouts", "layout-0", "legend")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    env = os.environ.get("SLOTPLAN_CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(tmp_path / "plans.sqlite3", FAST), raise_server_exceptions=False) as c:
        yield c


def test_page_in_process(client: TestClient) -> None:
    r = client.post("/v1/plans", json=BODY)
    assert r.status_code == 200
    pid = r.json()["id"]
    link = r.headers["link"]
    assert link == f'</v1/plans/{pid}/view>; rel="view"'
    assert client.get(f"/v1/plans/{pid}").headers["link"] == link
    page = client.get(f"/v1/plans/{pid}/view")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    for i in PAGE_IDS:
        assert f'id="{i}"' in text, i
    plan = r.json()["plan"]
    # every node is a row, with its rotations as the plan reports them and a reason
    for n in plan["nodes"]:
        assert f"<td>{n['id']}</td>" in text
    assert "lost on rotations" in text and "[c:128:1]~" in text and "dirty" in text
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(imgs) >= 2 and all(base64.b64decode(x).startswith(b"\x89PNG") for x in imgs)
    assert client.get(f"/v1/plans/{pid}/view").text == text  # deterministic (and cached)
    assert client.get("/v1/plans/" + "0" * 64 + "/view").status_code == 404
    assert client.get("/v1/plans/nope/view").status_code == 404
    assert "/v1/plans/{plan_id}/view" in client.get("/openapi.json").json()["paths"]


# ---------------------------------------------------------------- real browser


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[str]:
    import uvicorn

    port = _free_port()
    app = create_app(tmp_path / "plans.sqlite3", FAST)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                        log_config=None))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        if time.monotonic() > deadline or not th.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        th.join(10)


def _chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
         "--no-first-run", f"--user-data-dir={tmp / 'chromium-profile'}", *args],
        capture_output=True, timeout=120, check=False,
    )


def screenshot_page(binary: str, url: str, out: Path, tmp: Path, size: tuple[int, int] = (1400, 4200)) -> Path:
    proc = _chromium(binary, tmp, f"--window-size={size[0]},{size[1]}", f"--screenshot={out}", url)
    if not out.exists():
        raise AssertionError(f"chromium wrote no screenshot: {proc.stderr.decode(errors='replace')[-2000:]}")
    return out


def test_page_in_chromium(server: str, tmp_path: Path) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium not found (looked for " + ", ".join(CHROMIUM_NAMES) + " and $SLOTPLAN_CHROMIUM): "
                    "`make test` installs Debian's chromium with apt-get when it runs as root; otherwise "
                    "install it (apt-get install chromium) to run this browser test")
    r = httpx.post(f"{server}/v1/plans", json=BODY, timeout=120)
    assert r.status_code == 200
    m = re.match(r"<(/v1/plans/[0-9a-f]{64}/view)>", r.headers["link"])
    assert m
    url = server + m.group(1)
    assert httpx.get(url, timeout=120).status_code == 200  # rendered once (the browser then gets the cache)

    dom = _chromium(binary, tmp_path, "--dump-dom", url)
    text = dom.stdout.decode(errors="replace")
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    for i in PAGE_IDS:
        assert f'id="{i}"' in text, f"element #{i} missing from the DOM Chromium built"
    plan: dict[str, Any] = r.json()["plan"]
    assert all(f"<td>{n['id']}</td>" in text for n in plan["nodes"])

    shot = screenshot_page(binary, url, tmp_path / "page.png", tmp_path)
    import matplotlib.image as mpimg

    img = np.asarray(mpimg.imread(shot))[..., :3]
    assert img.shape[0] >= 4000 and img.shape[1] >= 1200
    ink = (img.min(axis=-1) < 0.85).mean()  # share of pixels that are not (near) white
    assert 0.02 < ink < 0.9, ink
    # the charts and layout pictures were drawn: coloured areas, not just black text on white
    colourful = (img.max(axis=-1) - img.min(axis=-1)) > 0.3
    assert colourful.mean() > 0.02, colourful.mean()
    assert colourful[img.shape[0] // 2:].mean() > 0.02  # the lower half too (charts, layouts)
    keep = os.environ.get("SLOTPLAN_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)

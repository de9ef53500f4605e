"""``slotplan.RemoteServer``: the evaluating side as a service (shared/SPEC.md section 7,
REST; docs/inference-service.md).

    server = slotplan.RemoteServer(url, api_key=KEY, plan_id=PLAN_ID)  # or .create_plan(graph, "n13")
    client = slotplan.Client(server.plan(), "keys/")
    server.upload_keys(client.keygen())          # once: a tar of eval/, streamed
    server.upload_weights(weights)               # once
    out = server.evaluate(client.encrypt({"x": x}))
    y = client.decrypt(out)

The secret key never leaves the client: only the evaluation keys, the weights and
ciphertexts travel.  Errors of the service come back as :class:`RemoteError` (a
:class:`SlotplanError` carrying the HTTP status and the service's one line).
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from backends import inference as inf
from common.errors import SlotplanError
from slotplan._inference import Ciphertext, EvalKeys
from slotplan._plan import Plan

__all__ = ["RemoteError", "RemoteServer"]


class RemoteError(SlotplanError):
    """The service refused a request: ``status`` is the HTTP status, ``body`` its JSON."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = dict(body or {})


def _tar_file(keys: EvalKeys) -> Any:
    """The key directory as an uncompressed tar in an unnamed temporary file (members
    ``eval/...``, what ``POST /v1/plans/{id}/keys`` takes), rewound."""
    fh = tempfile.TemporaryFile(prefix="slotplan-keys-")  # noqa: SIM115 - the caller closes it
    with tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in keys.files():
            info = tarfile.TarInfo(f"{inf.EVAL_DIR_NAME}/{p.relative_to(keys.path).as_posix()}")
            info.size = p.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            with open(p, "rb") as src:
                tar.addfile(info, src)
    fh.seek(0)
    return fh


def _chunks(fh: Any, size: int = 1 << 20) -> Iterator[bytes]:
    while True:
        b = fh.read(size)
        if not b:
            return
        yield b


class RemoteServer:
    """A plan on a slotplan service: upload evaluation keys and weights once, then
    evaluate ciphertexts.  ``http``: an ``httpx.Client``-like object to use instead of a
    new one (e.g. FastAPI's ``TestClient``)."""

    def __init__(self, url: str, api_key: str | None = None, plan_id: str | None = None, *,
                 key_id: str | None = None, weights_id: str | None = None, timeout: float = 600.0,
                 poll_s: float = 0.2, http: Any = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.plan_id = plan_id
        self.key_id = key_id
        self.weights_id = weights_id
        self.poll_s = poll_s
        self.timeout = timeout
        self._auth = {"X-API-Key": api_key} if api_key else {}
        self._own = http is None
        self._http: Any = httpx.Client(base_url=self.url, timeout=timeout) if http is None else http
        self.last: dict[str, Any] = {}

    # ---------------------------------------------------------------- plumbing

    def _check(self, r: Any, *ok: int) -> Any:
        if r.status_code in ok:
            return r
        try:
            body = r.json()
            msg = str(body.get("message", body))
        except ValueError:
            body, msg = {}, r.text[:500]
        raise RemoteError(r.status_code, f"service: HTTP {r.status_code}: {msg}", body if isinstance(body, dict) else {})

    def _need_plan(self) -> str:
        if not self.plan_id:
            raise SlotplanError("plan_id: not set (RemoteServer(url, api_key, plan_id) or create_plan)")
        return self.plan_id

    def _req(self, method: str, path: str, headers: Mapping[str, str] | None = None, **kw: Any) -> Any:
        return self._http.request(method, path, headers={**self._auth, **(headers or {})}, **kw)

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- plans

    def create_plan(self, graph: Mapping[str, Any], params: str | Mapping[str, Any] = "n13",
                    options: Mapping[str, Any] | None = None) -> str:
        """Plan ``graph`` on the service (``POST /v1/plans``, waiting for a 202 job) and make
        it this object's plan; returns the plan id."""
        body = {"graph": dict(graph), "params": params, "options": dict(options or {})}
        r = self._check(self._req("POST", "/v1/plans", json=body), 200, 202)
        pid = str(r.json()["id"])
        while r.status_code == 202:
            time.sleep(self.poll_s)
            r = self._check(self._req("GET", f"/v1/jobs/{pid}"), 200)
            st = r.json()
            if st["status"] == "failed":
                raise RemoteError(422, f"service: planning failed: {st.get('error')}", st)
            if st["status"] == "done":
                break
        self.plan_id = pid
        return pid

    def plan(self) -> Plan:
        """The plan document of ``plan_id`` (what :class:`slotplan.Client` generates keys
        for and encrypts with); its tables are rebuilt from it."""
        from backends.runner import regenerate_tables

        r = self._check(self._req("GET", f"/v1/plans/{self._need_plan()}"), 200)
        doc = r.json()["plan"]
        return Plan(doc, regenerate_tables(doc))

    # ---------------------------------------------------------------- uploads

    def upload_keys(self, keys: EvalKeys | str | Path) -> str:
        """Upload an evaluation key set (streamed from a temporary tar); returns its key_id
        (kept for :meth:`evaluate`)."""
        ek = keys if isinstance(keys, EvalKeys) else EvalKeys(keys)
        if (ek.path / inf.SECRET_KEY_NAME).exists():
            raise SlotplanError(f"{ek.path}: holds a secret key; upload the eval/ directory only")
        with _tar_file(ek) as fh:
            size = os.fstat(fh.fileno()).st_size
            r = self._check(self._req("POST", f"/v1/plans/{self._need_plan()}/keys", content=_chunks(fh),
                                            headers={"Content-Type": "application/x-tar",
                                                     "Content-Length": str(size)}), 201)
        self.key_id = str(r.json()["key_id"])
        self.last = r.json()
        return self.key_id

    def upload_weights(self, weights: Mapping[str, npt.ArrayLike] | str | Path) -> str:
        """Upload weights (arrays by tensor name, or a ``.npz`` path); returns weights_id."""
        if isinstance(weights, str | Path):
            data = Path(weights).read_bytes()
        else:
            buf = io.BytesIO()
            arrays: dict[str, Any] = {str(k): np.asarray(v, dtype=np.float64) for k, v in weights.items()}
            np.savez(buf, **arrays)
            data = buf.getvalue()
        r = self._check(self._req("POST", "/v1/weights", content=data,
                                        headers={"Content-Type": "application/octet-stream"}), 201)
        self.weights_id = str(r.json()["weights_id"])
        self.last = r.json()
        return self.weights_id

    def delete_keys(self, key_id: str | None = None) -> None:
        kid = key_id or self.key_id
        self._check(self._req("DELETE", f"/v1/keys/{kid}"), 204)
        if kid == self.key_id:
            self.key_id = None

    def delete_weights(self, weights_id: str | None = None) -> None:
        wid = weights_id or self.weights_id
        self._check(self._req("DELETE", f"/v1/weights/{wid}"), 204)
        if wid == self.weights_id:
            self.weights_id = None

    # ---------------------------------------------------------------- evaluation

    def evaluate(self, ct: Ciphertext | bytes, *, respond_async: bool = False) -> Ciphertext:
        """Evaluate a ciphertext file on the service with the uploaded keys and weights;
        waits for a 202 job.  ``last`` holds ``warm`` and ``seconds`` (the worker's)."""
        if not self.key_id or not self.weights_id:
            raise SlotplanError("evaluate: upload_keys and upload_weights first (or pass key_id / weights_id)")
        data = ct.to_bytes() if isinstance(ct, Ciphertext) else bytes(ct)
        headers = {"Content-Type": "application/octet-stream"}
        if respond_async:
            headers["Prefer"] = "respond-async"
        r = self._check(self._req("POST", f"/v1/plans/{self._need_plan()}/evaluate", content=data,
                                        params={"key_id": self.key_id, "weights_id": self.weights_id},
                                        headers=headers), 200, 202)
        if r.status_code == 202:
            job = r.headers["location"].rsplit("/", 1)[-1]
            while True:
                r = self._check(self._req("GET", f"/v1/jobs/{job}/result"), 200, 202)
                if r.status_code == 200:
                    break
                time.sleep(self.poll_s)
        self.last = {"warm": r.headers.get("x-slotplan-warm"),
                     "seconds": float(r.headers.get("x-slotplan-eval-seconds") or "nan"),
                     "key_load_seconds": float(r.headers.get("x-slotplan-key-load-seconds") or "nan")}
        return Ciphertext.from_bytes(r.content)

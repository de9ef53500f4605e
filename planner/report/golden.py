"""Golden plan summaries: the expected digest of every reference workload.

``data/golden/manifest.json`` lists what to plan (graph path relative to the manifest,
params preset, planning options); ``data/golden/<graph>.<params>.json`` holds the expected
digest (see :mod:`planner.report.diff`: the summary without timings plus every node's kernel,
kernel parameters and rotations).  :func:`check` plans every entry fresh and diffs it
against its golden file; :func:`regenerate` rewrites the golden files
(``slotplan golden --regenerate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import SlotplanError
from common.paths import DATA_DIR
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions, PlanOptionsLiteral, PlanResult, PlanTimeout, plan_graph
from planner.report.diff import DIGEST_SCHEMA, DiffReport, diff_digests, plan_digest

GOLDEN_DIR = DATA_DIR / "golden"
MANIFEST_SCHEMA = "slotplan.golden-manifest/1"


class GoldenError(SlotplanError):
    pass


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    graph: str
    params: str = "n16"
    options: dict[str, Any] = Field(default_factory=dict)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: str = Field(alias="schema", pattern=r"^slotplan\.golden-manifest/1$")
    description: str = ""
    entries: list[ManifestEntry]
    # graphs under data/workloads too large to plan in the test suite (planning only at
    # n16boot, minutes on two cores): the suite loads and validates them, nothing more
    planning_only: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class GoldenCase:
    entry: ManifestEntry
    graph_path: Path
    golden_path: Path
    name: str


def load_manifest(golden_dir: Path = GOLDEN_DIR) -> list[GoldenCase]:
    path = golden_dir / "manifest.json"
    try:
        manifest = Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise GoldenError(f"golden manifest {path} not found") from None
    except (json.JSONDecodeError, ValidationError) as e:
        raise GoldenError(f"golden manifest {path}: {' '.join(str(e).split())}") from None
    cases: list[GoldenCase] = []
    for entry in manifest.entries:
        graph_path = (golden_dir / entry.graph).resolve()
        name = load_graph(graph_path).name
        cases.append(GoldenCase(entry, graph_path, golden_dir / f"{name}.{entry.params}.json", name))
    return cases


def planning_only(golden_dir: Path = GOLDEN_DIR) -> list[Path]:
    """The manifest's planning-only graphs (resolved paths)."""
    path = golden_dir / "manifest.json"
    manifest = Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    return [(golden_dir / g).resolve() for g in manifest.planning_only]


def fresh_plan(case: GoldenCase) -> PlanResult:
    """Plan the case now (raises the planner's errors)."""
    entry = case.entry
    graph = load_graph(case.graph_path)
    params = load_params(entry.params)
    opts = PlanOptions.from_literal(PlanOptionsLiteral(**entry.options))
    return plan_graph(graph, params, opts)


def fresh_digest(case: GoldenCase, result: PlanResult | None = None) -> dict[str, Any]:
    """Plan the case now (or take ``result``, its plan) and return its golden digest
    (errors become status error)."""
    entry = case.entry
    try:
        plan = (result or fresh_plan(case)).plan
    except (SlotplanError, ValidationError) as exc:
        status = "timeout" if isinstance(exc, PlanTimeout) else "error"
        return {
            "schema": DIGEST_SCHEMA,
            "graph": {"name": case.name, "sha256": None},
            "params": entry.params,
            "options": dict(entry.options),
            "status": status,
            "error": " ".join(str(exc).split()),
            "summary": None,
            "nodes": [],
        }
    digest = plan_digest(plan, layouts=False)
    digest["params"] = entry.params
    # the options as requested: the expanded defaults (e.g. the kernel list) are the
    # planner's business, and a new default kernel should show up as a plan change
    digest["options"] = dict(entry.options)
    return digest


def dumps_digest(digest: dict[str, Any]) -> str:
    return json.dumps(digest, indent=1, sort_keys=True, allow_nan=False) + "\n"


def load_golden(case: GoldenCase) -> dict[str, Any] | None:
    try:
        obj = json.loads(case.golden_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise GoldenError(f"golden file {case.golden_path}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict) or obj.get("schema") != DIGEST_SCHEMA:
        raise GoldenError(f"golden file {case.golden_path}: schema must be {DIGEST_SCHEMA!r}")
    return obj


def regenerate(golden_dir: Path = GOLDEN_DIR) -> list[Path]:
    """Plan every manifest entry and (re)write its golden file; returns the files written."""
    written: list[Path] = []
    for case in load_manifest(golden_dir):
        digest = fresh_digest(case)
        if digest["status"] != "ok":
            raise GoldenError(f"{case.name} @ {case.entry.params}: {digest['error']}")
        case.golden_path.write_text(dumps_digest(digest), encoding="utf-8")
        written.append(case.golden_path)
    return written


def check(golden_dir: Path = GOLDEN_DIR) -> DiffReport:
    """Plan every manifest entry fresh and diff the results against the golden files
    (a missing golden file shows as an added graph)."""
    base: list[dict[str, Any]] = []
    head: list[dict[str, Any]] = []
    for case in load_manifest(golden_dir):
        golden = load_golden(case)
        if golden is not None:
            base.append(golden)
        head.append(fresh_digest(case))
    return diff_digests(base, head, "batch", f"{golden_dir} (golden)", "fresh plans")

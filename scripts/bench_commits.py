"""Time the same workloads encrypted on Lattigo with two checkouts of slotplan, in one job.

    python scripts/bench_commits.py --before 3d6f9c3 --params n14 \\
        --workloads conv1,conv2,conv3,conv4,rotom/ctct_128@n13,fame/mm_64_64_64@n13 --repeat 3

For each workload, and for each repeat round, the two checkouts run one after the other
(before, after, before, after, ...), so a drift of the machine during the job reaches both.
Each run is a fresh process of its checkout's own code: it plans the workload with that
checkout's planner (``PlanOptions(input_layout="free")``, as ``lattigo-bench``) and times
the plan with that checkout's ``backends.lattigo_bench.run_plan_bench`` (``repeat=1``),
on the same seeded data (``planner.frontend.reference.random_values``). The row reports the median
of the rounds per checkout, each run's time, the plan's rotations, and the relative error
against numpy.

``--before REV``: a git revision of this repository. Its checkout (a git worktree), its
virtual environment and its Go extension are made under ``--work`` (default
``/tmp/slotplan-before-<rev>``) on first use: ``pip install -e`` from the package index and
``backends/lattigo/build.sh`` with ``VENV``. ``--after`` defaults to this checkout and its
``.venv`` (run ``make install`` first).

``eval_seconds`` excludes plaintext encoding in both: before issue 18 the executor encoded
every plaintext again in each evaluation and subtracted that time (``encode_seconds``);
after it, plaintexts are encoded once per model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys
from planner.frontend.graph import load_graph
from planner.frontend.params import load_params
from planner.pipeline import PlanOptions
from planner.frontend.reference import random_values
from backends.lattigo_bench import run_plan_bench
path, params, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = load_graph(path)
p = load_params(params)
row = run_plan_bench(g, p, PlanOptions(input_layout="free"), random_values(g, seed), 1)
keep = ("status", "eval_seconds", "encode_seconds", "rotations", "max_rel_error", "plan_seconds",
        "pmul", "depth")
print("ROW " + json.dumps({k: row.get(k) for k in keep if k in row}))
"""


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr, **kw)  # type: ignore[call-overload]


def prepare(rev: str, work: Path) -> tuple[Path, Path]:
    """The checkout of ``rev`` and its Python, built on first use."""
    src, venv = work / "src", work / "venv"
    if not (src / ".git").exists():
        _run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(src), rev])
    py = venv / "bin" / "python"
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(py), "-m", "pip", "install", "-q", "-e", str(src)])
    _run(["bash", str(src / "backends" / "lattigo" / "build.sh")], env=os.environ | {"VENV": str(venv)})
    return src, py


def one(src: Path, py: Path, graph: Path, params: str, seed: int) -> dict[str, object]:
    env = os.environ | {"PYTHONPATH": str(src)}
    p = subprocess.run([str(py), "-c", WORKER, str(graph), params, str(seed)], cwd=src, env=env,
                       capture_output=True, text=True, check=False)
    for line in p.stdout.splitlines():
        if line.startswith("ROW "):
            return dict(json.loads(line[4:]))
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": f"failed: {tail}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git revision to compare with")
    ap.add_argument("--work", type=Path, help="where the before checkout lives")
    ap.add_argument("--params", default="n14", help="preset of workloads without their own")
    ap.add_argument("--workloads", default="conv1,conv2,conv3,conv4",
                    help="data/workloads/<name>.json[@preset], comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON line per workload")
    a = ap.parse_args()
    if a.repeat < 1:
        print("bench_commits: --repeat must be at least 1", file=sys.stderr)
        return 2
    specs = [w.strip() for w in a.workloads.split(",") if w.strip()]
    todo = [(w.split("@")[0], w.split("@", 1)[1] if "@" in w else a.params) for w in specs]
    for w, _ in todo:
        if not (ROOT / "data" / "workloads" / f"{w}.json").exists():
            print(f"bench_commits: unknown workload {w!r} (no data/workloads/{w}.json)", file=sys.stderr)
            return 2
    work = a.work or Path(f"/tmp/slotplan-before-{a.before}")
    before = prepare(a.before, work)
    after = (ROOT, ROOT / ".venv" / "bin" / "python")
    for w, preset in todo:
        graph = ROOT / "data" / "workloads" / f"{w}.json"
        runs: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
        for _ in range(a.repeat):
            for tag, (src, py) in (("before", before), ("after", after)):
                runs[tag].append(one(src, py, graph, preset, a.seed))
        row: dict[str, object] = {"workload": w, "params": preset, "before_rev": a.before}
        for tag, rs in runs.items():
            ok = [r for r in rs if r.get("status", "ok") == "ok" and r.get("eval_seconds") is not None]
            if not ok:
                row[tag] = {"status": rs[0].get("status")}
                continue
            ev = [float(r["eval_seconds"]) for r in ok]  # type: ignore[arg-type]
            row[tag] = ok[0] | {"eval_seconds": statistics.median(ev), "eval_seconds_runs": ev}
        b, f = row.get("before"), row.get("after")
        if isinstance(b, dict) and isinstance(f, dict) and "eval_seconds_runs" in b and "eval_seconds_runs" in f:
            row["before_over_after"] = round(float(b["eval_seconds"]) / float(f["eval_seconds"]), 2)
        if a.json:
            print(json.dumps(row), flush=True)
        else:
            def cell(x: object) -> str:
                if not isinstance(x, dict) or "eval_seconds" not in x:
                    return str(x.get("status") if isinstance(x, dict) else x)
                enc = x.get("encode_seconds")
                return (f"{x['eval_seconds']:.3f} s ({', '.join(f'{v:.3f}' for v in x['eval_seconds_runs'])})"
                        f" rot {x.get('rotations')}" + (f" enc {enc:.3f}" if isinstance(enc, float) else ""))
            print(f"{w + '@' + preset:28} before {cell(b)} | after {cell(f)} | before/after {row.get('before_over_after')}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

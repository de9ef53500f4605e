#!/usr/bin/env bash
# Plan-diff report for CI (docs/ci/plan-diff.yml calls this; docs/rest.md "Plan diffs in CI").
#
#   scripts/plan_diff_ci.sh BASE_REF HEAD_REF GRAPH...
#
# Checks out BASE_REF and HEAD_REF (git worktrees in a temporary directory), plans the
# graphs (paths relative to the repository root) with each commit's own slotplan
# (`python -m api.cli batch`), and writes `slotplan diff --format md` of the two results
# to $GITHUB_STEP_SUMMARY (stdout when unset).  Exits 1 when the head regresses (more
# rotations or key loads, a larger modelled peak, outputs no longer clean, parameters that
# became insecure, a graph that stopped planning), 0 otherwise, 2 on bad input.
#
# Environment: PLAN_DIFF_PARAMS (default n13), PLAN_DIFF_TIME_LIMIT (solver seconds per
# graph, default 30), PYTHON (default python3), PLAN_DIFF_OUT (also keep base.jsonl,
# head.jsonl and report.md there).
set -euo pipefail

if [ "$#" -lt 3 ]; then
    echo "usage: $0 BASE_REF HEAD_REF GRAPH..." >&2
    exit 2
fi
base_ref=$1
head_ref=$2
shift 2
params=${PLAN_DIFF_PARAMS:-n13}
time_limit=${PLAN_DIFF_TIME_LIMIT:-30}
py=${PYTHON:-python3}
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d "${TMPDIR:-/tmp}/slotplan-plan-diff.XXXXXX")

cleanup() {
    for side in base head; do
        if [ -d "$work/$side" ]; then
            git -C "$repo" worktree remove --force "$work/$side" >/dev/null 2>&1 || true
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT

for side in base head; do
    if [ "$side" = base ]; then ref=$base_ref; else ref=$head_ref; fi
    git -C "$repo" worktree add --quiet --detach "$work/$side" "$ref"
    # a graph that fails to plan is a line of the results (the diff reports it), not the end
    rc=0
    (cd "$work/$side" && PYTHONPATH="$work/$side" "$py" -m api.cli batch "$@" --params "$params" \
        --time-limit "$time_limit" --jobs 1 --out "$work/$side.jsonl" >&2) || rc=$?
    if [ ! -s "$work/$side.jsonl" ]; then
        echo "plan-diff: batch on $side ($ref) wrote no results (exit $rc)" >&2
        exit 2
    fi
done

status=0
(cd "$work/head" && PYTHONPATH="$work/head" "$py" -m api.cli diff "$work/base.jsonl" "$work/head.jsonl" \
    --format md --fail-on-regression) > "$work/report.md" || status=$?
{
    echo "## slotplan plan diff: ${base_ref:0:12} -> ${head_ref:0:12} ($params)"
    echo
    cat "$work/report.md"
} >> "${GITHUB_STEP_SUMMARY:-/dev/stdout}"
if [ -n "${PLAN_DIFF_OUT:-}" ]; then
    mkdir -p "$PLAN_DIFF_OUT"
    cp "$work/base.jsonl" "$work/head.jsonl" "$work/report.md" "$PLAN_DIFF_OUT/"
fi
exit "$status"

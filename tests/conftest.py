"""Shared fixtures: the preset matrix, the CLI in-process, and fakes for the plug-in roles
(a solver back end and an execution back end registered for one test, as TVM MetaSchedule
ships dummy objects), so that the pipeline and the runner are tested against their
registries, not against cpsat and sim alone."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from backends.runner import EXECUTION_BACKENDS, SIM_RTOL, Execution
from planner.frontend.graph import Graph
from planner.frontend.params import PRESETS, Params, load_params
from planner.frontend.reference import reference
from solver import SOLVER_BACKENDS
from solver.model import ChoiceModel, Solution, Status

# Every built-in ring preset (n12..n16): tests that must hold on each take ``preset``.
PRESET_NAMES = tuple(sorted(n for n in PRESETS if n[1:].isdigit()))


@pytest.fixture(params=PRESET_NAMES)
def preset(request: pytest.FixtureRequest) -> Params:
    return load_params(request.param)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``cli("plan", "g.json", ...)`` -> (exit status, stdout, stderr), in this process."""
    from tests.helpers import run_cli

    return lambda *args: run_cli([str(a) for a in args], capsys)


class GreedySolver:
    """A solver back end that answers with the model's greedy choice (status feasible)."""

    name = "fake-greedy"

    def solve(self, model: ChoiceModel, time_limit_s: float) -> Solution:
        choice = model.greedy()
        return Solution(tuple(choice.items()), Status.FEASIBLE, model.evaluate(choice), None, 0.0, self.name)


@pytest.fixture
def fake_solver() -> Iterator[str]:
    with SOLVER_BACKENDS.temporarily(GreedySolver.name, GreedySolver) as name:
        yield name


def _reference_backend(offset: float) -> Callable[..., Execution]:
    def run(plan: Mapping[str, Any], tables: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray],
            graph: Graph, params: Params) -> Execution:
        ref = reference(graph, values)
        outs = {t: ref[t] + offset for t in graph.outputs}
        return Execution(outs, {"fake": 1}, 0, 0, 0, SIM_RTOL, {"backend": "fake"})

    return run


@pytest.fixture
def fake_backends() -> Iterator[tuple[str, str]]:
    """Two execution back ends: one that answers the reference, one that is off by 1e-3."""
    with EXECUTION_BACKENDS.temporarily("fake-exact", _reference_backend(0.0)), \
            EXECUTION_BACKENDS.temporarily("fake-off", _reference_backend(1e-3)):
        yield "fake-exact", "fake-off"


# ---------------------------------------------------------------------------- test tiers
# `make test` runs ``-m "not slow"``; `make test-all` runs everything. The tests below are
# marked slow here (one list, so that a test file's edits and the tiers do not collide):
# node id (a prefix: a whole test or one parametrisation) -> the default-tier test that
# still covers its behaviour (docs/testing.md says what each checks and why that suffices;
# tests/test_tiers.py checks that every entry and every cover names a real test).
SLOW_TESTS: dict[str, str] = {
    # FHELIPE's 65535 rotations of MVM2 (about 17 s); the same baseline kernel reproduces the
    # paper's count on MVM1
    "tests/planner/kernels/test_metakernel.py::test_fhelipe_baseline_reproduces_paper_counts[mvm2-65535]":
        "tests/planner/kernels/test_metakernel.py::test_fhelipe_baseline_reproduces_paper_counts[mvm1-6658]",
    # two of the twelve random graphs under random caps (13 s each on this machine); the
    # other ten stay in the default tier
    "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[1]":
        "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[0]",
    "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[4]":
        "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[0]",
    # the CI recipe's script on two commits of a clone: git worktrees and six fresh Python
    # processes (23 s); what it runs is covered by batch_results_diff (batch lines diffed)
    # and cli_diff_formats_and_exit_codes (--fail-on-regression: 1 on a regression, 0 on none)
    "tests/api/test_plan_diff_ci.py::test_script_reports_a_regression_and_passes_a_clean_head":
        "tests/planner/report/test_diff.py::test_cli_diff_formats_and_exit_codes",
    # a batched plan with the densify route encrypted on Lattigo (17 s); the route's program is
    # plain instructions: each packing route forced alone, simulated against numpy with every
    # layout claim, on three grids; batched plans on Lattigo: test_split_round_trip_n_samples
    "tests/planner/batch/test_batch_densify.py::test_dense_route_for_room_on_lattigo":
        "tests/planner/assign/test_densify.py::test_each_packing_route_alone",
    # two n14boot evaluations (59 s beside the other worker); the kept DFT matrices are
    # checked in `go test -short` at log N 12 (bootstate_test.go: across Run calls, reloads,
    # Evaluate's samples), their Python report by the model-bench test
    "tests/backends/test_lattigo_bootstate.py::test_second_evaluation_reuses_the_matrices":
        "tests/api/test_model_bench.py::test_small_model_modelled_and_measured_on_lattigo",
    "tests/e2e/test_boot_suite.py::test_solvers_place_the_same_bootstraps[keymemrt_lola]":
        "tests/e2e/test_boot_suite.py::test_solvers_place_the_same_bootstraps[keymemrt_mlp]",
    # the ResNet-20 graphs are planned with CP-SAT only there (z3 does not prove them in test
    # time): the golden plans the same graph at n16boot (CP-SAT optimal, every depth within
    # the levels: the hygiene test), and the smaller suite graphs compare both solvers
    "tests/e2e/test_boot_suite.py::test_solvers_place_the_same_bootstraps[resnet20_cifar10_deg15]":
        "tests/planner/report/test_golden.py::test_golden[resnet20_cifar10.n16boot]",
    "tests/e2e/test_boot_suite.py::test_solvers_place_the_same_bootstraps[resnet20_cifar10]":
        "tests/planner/report/test_golden.py::test_golden[resnet20_cifar10.n16boot]",
    "tests/backends/test_lattigo_memory.py::test_run_reports_the_process_model":
        "tests/backends/test_lattigo_memory.py::test_small_run_reports_the_process_model",
    "tests/planner/report/test_golden.py::test_golden[rotom_bert_attention.n16]":
        "tests/planner/report/test_golden.py::test_golden[rotom_bert_attention_2heads.n14]",
    "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
    "[rotom_bert_attention.n16]":
        "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
        "[rotom_bert_attention_2heads.n14]",
    "tests/planner/report/test_golden.py::test_golden[mvm2.n16]":
        "tests/planner/report/test_golden.py::test_golden[mvm1.n16]",
    "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean[mvm2.n16]":
        "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean[mvm1.n16]",
    "tests/planner/report/test_golden.py::test_golden[resnet18_conv1_imagenet.n16]":
        "tests/planner/kernels/test_kernels_sim.py::test_segmented_conv_channels_larger_than_a_ciphertext",
    "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
    "[resnet18_conv1_imagenet.n16]":
        "tests/planner/kernels/test_kernels_sim.py::test_segmented_conv_channels_larger_than_a_ciphertext",
    "tests/planner/report/test_golden.py::test_golden[resnet20_cifar10_deg15.n16boot]":
        "tests/planner/report/test_golden.py::test_golden[resnet20_cifar10.n16boot]",
    "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
    "[resnet20_cifar10_deg15.n16boot]":
        "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
        "[resnet20_cifar10.n16boot]",
    **{f"tests/planner/report/test_golden.py::test_golden[{w}.n16]":
       "tests/planner/report/test_golden.py::test_golden[conv3_large.n16]"
       for w in ("conv1_large", "conv2_large", "conv4_large")},
    **{f"tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean[{w}.n16]":
       "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
       "[conv3_large.n16]" for w in ("conv1_large", "conv2_large", "conv4_large")},
    "tests/planner/report/test_golden.py::test_golden[rotom_double_matmul_32k.n16]":
        "tests/planner/report/test_golden.py::test_golden[rotom_double_matmul_8k.n14]",
    "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
    "[rotom_double_matmul_32k.n16]":
        "tests/planner/report/test_workload_hygiene.py::test_workload_counts_add_up_and_outputs_are_clean"
        "[rotom_double_matmul_8k.n14]",
    "tests/backends/test_lattigo_neujeans.py::test_neujeans_order_and_fused_conv_n14boot":
        "tests/planner/layout/test_cins.py",
    "tests/backends/test_lattigo_boot.py::test_bench_plan_bootstraps_keep_all_and_scheduled":
        "tests/backends/test_lattigo_boot.py::test_bootstrap_plan_n12boot",
    "tests/backends/test_lattigo_boot.py::test_streamed_boot_block_under_a_cap_on_lattigo":
        "tests/e2e/test_bootstrap_plans.py::test_streamed_block_memory_follows_the_executor",
    "tests/backends/test_lattigo_boot.py::test_planned_bootstrap_keeps_precision_at_its_worst_case":
        "tests/backends/test_lattigo_boot.py::test_bootstrap_plan_n12boot",
    "tests/planner/report/test_explain.py::test_bench_progress_keeps_stdout":
        "tests/planner/report/test_explain.py::test_bench_progress_keeps_stdout_one_workload",
    "tests/planner/batch/test_batch.py::test_batch_on_ray_matches_the_pool":
        "tests/api/test_inference_service_ray.py",
    "tests/planner/kernels/test_kernels_sim.py::test_matvec_all_kernels_match_numpy":
        "tests/planner/kernels/test_kernels_sim.py::test_matvec_all_kernels_fixed_shapes",
    "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[conv2 default (Q-mode blocks)-0.3]":
        "tests/backends/test_lattigo_fused.py::test_q_mode_blocks_as_the_model_counts[0.75]",
    "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[conv2 default (Q-mode blocks)-0.75]":
        "tests/backends/test_lattigo_fused.py::test_q_mode_blocks_as_the_model_counts[0.75]",
    "tests/e2e/test_ranges_enforced.py::test_relu_cnn_out_of_range_image_refused_then_poly_domain_fails[lattigo]":
        "tests/e2e/test_ranges_enforced.py::test_relu_cnn_out_of_range_image_refused_then_poly_domain_fails[sim]",
    "tests/planner/kernels/test_metakernel.py::test_default_plan_never_worse_than_imra[conv4_large]":
        "tests/planner/kernels/test_metakernel.py::test_default_plan_never_worse_than_imra[conv4]",
    "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[mvm 64x64 imra-0.3]":
        "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[mvm 64x64 imra-0.75]",
    "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[conv1 default-0.3]":
        "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[conv1 default-0.75]",
    "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[mlp default-0.3]":
        "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[mlp default-0.75]",
    "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[mvm 20x20 hs-diagonal-0.3]":
        "tests/backends/test_lattigo_fused.py::test_fused_under_a_key_schedule[mvm 20x20 hs-diagonal-0.75]",
    "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[3]":
        "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps",
    "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[11]":
        "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps",
    "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps[5]":
        "tests/planner/keys/test_keyplan.py::test_random_graphs_under_random_caps",
    "tests/planner/keys/test_keys.py::test_exact_belady_z3_on_synthetic_programs[4]":
        "tests/planner/keys/test_keys.py::test_exact_belady_z3_on_synthetic_programs",
    "tests/planner/kernels/test_kernels_sim.py::test_matvec_all_kernels_fixed_shapes[row-major-512-512]":
        "tests/planner/kernels/test_kernels_sim.py::test_matvec_all_kernels_fixed_shapes[free-512-512]",
    "tests/api/test_hardening.py::test_smallest_feasible_cap_does_not_depend_on_the_cap_asked":
        "tests/api/test_hardening.py::test_smallest_feasible_cap_does_not_depend_on_the_cap_asked_small",
    "tests/planner/assign/test_random_networks.py::test_random_networks[140]":
        "tests/planner/assign/test_random_networks.py::test_random_networks",
    "tests/e2e/test_bootstrap_plans.py::test_random_networks_with_bootstraps_brute_force_and_solvers[3]":
        "tests/e2e/test_bootstrap_plans.py::test_random_networks_with_bootstraps_brute_force_and_solvers",
    "tests/backends/test_lattigo_bootvariants.py::test_variants_on_lattigo[n14boot]":
        "tests/backends/test_lattigo_bootvariants.py::test_simulator_variants_and_noise",
    "tests/backends/test_lattigo_level_drops.py::test_level_drops_n14boot":
        "tests/backends/test_lattigo_boot.py::test_bootstrap_plan_n12boot",
    # the same program and checks on the same chain at log N 12 (6 s against ~40 s: keys of
    # 0.29 GB, not 1.4 GB); the Go side's bootstrapping tests run at log N 12 too
    "tests/backends/test_lattigo_boot.py::test_bootstrap_plan_n14boot":
        "tests/backends/test_lattigo_boot.py::test_bootstrap_plan_n12boot",
    "tests/planner/keys/test_keys.py::test_tight_cap_changes_the_kernel_choice":
        "tests/planner/assign/test_candidates.py::test_a_cap_below_a_candidates_own_minimum_drops_it",
    "tests/e2e/test_bootstrap_plans.py::test_random_networks_with_bootstraps_brute_force_and_solvers[11]":
        "tests/e2e/test_bootstrap_plans.py::test_random_networks_with_bootstraps_brute_force_and_solvers",
}


def _matches(nodeid: str, key: str) -> bool:
    """``key`` names this test: the test itself, one of its parametrisations, or its file."""
    return nodeid == key or nodeid.startswith(key + "[") or nodeid.startswith(key + "::")


def _id(item: pytest.Item) -> str:
    """The test's id without pytest-xdist's ``@group`` suffix (``--dist loadgroup`` appends it
    to an ``xdist_group`` test's id in the worker processes)."""
    return item.nodeid.rsplit("@", 1)[0] if item.get_closest_marker("xdist_group") else item.nodeid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ids = [_id(i) for i in items]
    for item, nid in zip(items, ids, strict=True):
        if any(_matches(nid, k) for k in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    # where every file the list names was collected, each entry must name a test and each
    # cover a test of the default tier (a renamed test must not leave its tier silently)
    files = {nid.split("::")[0] for nid in ids}
    named = {k.split("::")[0] for k in (*SLOW_TESTS, *SLOW_TESTS.values())}
    if not named <= files:
        return
    fast = [nid for i, nid in zip(items, ids, strict=True) if i.get_closest_marker("slow") is None]
    bad = [k for k in SLOW_TESTS if not any(_matches(nid, k) for nid in ids)]
    bad += [f"{c} (cover)" for c in set(SLOW_TESTS.values()) if not any(_matches(n, c) for n in fast)]
    if bad:
        raise pytest.UsageError("tests/conftest.py SLOW_TESTS names no test of its tier: " + ", ".join(sorted(bad)))


REQUIRE_LATTIGO_ENV = "SLOTPLAN_REQUIRE_LATTIGO"


def pytest_configure(config: pytest.Config) -> None:
    """With SLOTPLAN_REQUIRE_LATTIGO=1 (``make test``, which has just built the extension), a
    process that cannot import the Lattigo extension stops the run with the import's error:
    the backend's ~150 tests would otherwise skip and the run pass (the controller and every
    xdist worker check, each in its own process)."""
    if os.environ.get(REQUIRE_LATTIGO_ENV, "").strip() in ("", "0"):
        return
    from backends import lattigo_backend

    try:
        lattigo_backend._ext()
    except lattigo_backend.LattigoError as e:
        raise pytest.UsageError(f"{REQUIRE_LATTIGO_ENV} is set but this test process cannot import the "
                                f"Lattigo extension: {e}") from None

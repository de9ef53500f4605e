"""Batches of samples (SPEC section 8): the sample index as the innermost slot dimension.

A plan of batch ``B`` holds ``B`` samples per ciphertext set.  With ``P`` the smallest power
of two >= B and ``stride = S / P`` (``S`` the ring's slots), slot ``j * P + b`` holds what
slot ``j`` of a one-sample plan for a ring of ``stride`` slots holds for sample ``b``;
samples ``B..P-1`` are zero samples (padding).  In Rotom's notation the batch is the
innermost dimension ``[B:P:1]`` and every other slot stride is multiplied by ``P``.

Why innermost: a left rotation by ``k * P`` of the real ring moves slot ``j * P + b`` to
``((j + k) mod stride) * P + b`` -- exactly the block ring's rotation by ``k``, for every
sample at once, wrap-around included.  Slot-wise operations (adds, products, polynomials,
rescales, bootstraps) act on each slot.  So the real ring is ``P`` interleaved copies of the
block ring and *every* kernel and conversion is exact per sample, whatever its rotations
do (replication by wrapping, rotate-and-sum reductions over the whole ring, masks): no
kernel is refused or repriced for the batch.  The sample index placed outermost instead
(contiguous blocks) breaks every kernel whose rotations wrap around the ring: a wrapped
read meets the next sample's block (measured on the random networks: most plans).

How it is planned: the graph (one sample) is planned for a *block ring* of ``stride``
slots, priced with the real ring's costs (``BlockParams`` keeps ``log_n`` and the levels;
only the slot count the layouts see changes).  The plan is then read as a plan of the real
ring: rotation amounts times ``P``, weight and constant plaintexts the block tables with
every slot repeated ``P`` times, input and output tables mapping slot ``j * P + b`` to
sample ``b`` of the batched tensors (leading dimension ``B``).  Bootstraps refresh all the
samples of a ciphertext at once; their placement and scaling are the one-sample plan's
(ranges hold per sample, so the same intervals bound every sample).  A bootstrap variant
(issue 36) at ``2^k`` slots of the block ring is one at ``2^(k + log2 P)`` of the real ring:
block slot ``j < 2^k`` is real slot ``j * P + b < 2^k * P``.  The block parameters offer the
real ring's variants so shifted (``BlockParams.boot_shift``), priced by the real variant's
table entry, and the batched program's bootstraps carry the real ring's ``log_slots``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.assign.candidates import PlanError
from planner.frontend.params import Params
from planner.ir.builder import LazyTables, TableSpec
from planner.ir.fused_plan import annotate
from planner.layout.channels import MappedLayout

if TYPE_CHECKING:
    from planner.assign.options import PlanOptions
    from planner.frontend.graph import Graph
    from planner.single import PlanResult

# ops the block-ring reading does not cover (complex packing, NeuJeans' CinS registers)
REFUSED_OPS = ("mul_i", "conj", "to_cins", "bootstrap_cins", "load_key", "drop_key")


class BatchError(PlanError):
    """A batch the plan cannot hold (too many samples, kernels that are not slot-wise)."""


@dataclass(frozen=True)
class BlockParams(Params):
    """The parameters of the real ring with the slot count of one sample's block."""

    block_slots: int = 0
    # log2 P: a bootstrap variant at 2^k block slots is the real ring's at 2^(k + boot_shift)
    boot_shift: int = 0

    def __post_init__(self) -> None:
        pass  # the real ring's parameters were validated (the boot key offsets exceed the block)

    @property
    def slots(self) -> int:
        return self.block_slots

    @property
    def variant_shift(self) -> int:
        return self.boot_shift


@dataclass(frozen=True)
class BatchInfo:
    batch: int  # samples B
    blocks: int  # P: power of two >= B; samples B..P-1 are zero samples (padding)
    stride: int  # slots of the block ring (one sample's plan): S / P
    slots: int  # slots of the real ring

    def notation(self) -> str:
        return f"[B:{self.batch}:1]"


def batch_geometry(slots: int, batch: int) -> BatchInfo:
    if batch < 1:
        raise BatchError(f"field 'batch': must be a positive number of samples, got {batch}")
    blocks = 1 << (batch - 1).bit_length()
    if blocks > slots:
        raise BatchError(f"field 'batch': {batch} samples do not fit {slots} slots (at most {slots})")
    return BatchInfo(batch, blocks, slots // blocks, slots)


def block_params(params: Params, stride: int) -> Params:
    """The real ring's parameters as one sample's block ring of ``stride`` slots sees them:
    the same chain and keys; the bootstrap variants at ``2^k`` real slots offered at
    ``2^(k - log2 P)`` block slots (module docstring), their keys and matrices the real ones."""
    if stride == params.slots:
        return params
    shift = (params.slots // stride).bit_length() - 1
    boot = params.boot
    if boot is not None and boot.variants:
        boot = replace(boot, variants=tuple(replace(v, log_slots=v.log_slots - shift)
                                            for v in boot.variants if v.log_slots - shift >= 1))
    return BlockParams(params.log_n, params.log_q, params.log_p, params.log_scale, params.name, params.note,
                       boot, block_slots=stride, boot_shift=shift)


def _real_variant(label: str, shift: int) -> str:
    """A block ring's variant label (``s<k>``, ``h<k>``, ``p<k>``, ``r<k>``) in the real ring's terms."""
    m = re.fullmatch(r"([shpr])(\d+)", label)
    return f"{m.group(1)}{int(m.group(2)) + shift}" if m else label


def _real_bootstraps(program: list[dict[str, Any]], nodes: list[dict[str, Any]],
                     boot_summary: Any, shift: int) -> Any:
    """The block plan's bootstrap variants read in the real ring (``log_slots + shift``):
    the program's ``bootstrap``/``bootstrap2`` instructions in place, the nodes'
    ``boot_variant`` and the per-bootstrap report; returns the report."""
    if shift == 0:
        return boot_summary
    for i, d in enumerate(program):
        if d["op"] in ("bootstrap", "bootstrap2") and d.get("log_slots") is not None:
            program[i] = {**d, "log_slots": int(d["log_slots"]) + shift}
    for n in nodes:
        if "boot_variant" in n:
            n["boot_variant"] = _real_variant(n["boot_variant"], shift)
    if isinstance(boot_summary, dict) and boot_summary.get("per_bootstrap"):
        boot_summary = {**boot_summary, "per_bootstrap": [
            {**e, **({"variant": _real_variant(e["variant"], shift)} if "variant" in e else {}),
             **({"log_slots": int(e["log_slots"]) + shift} if e.get("log_slots") is not None else {})}
            for e in boot_summary["per_bootstrap"]],
            **({"variants_offered": sorted(_real_variant(x, shift) for x in boot_summary["variants_offered"])}
               if "variants_offered" in boot_summary else {})}
    return boot_summary


def _spread_idx(idx: np.ndarray, size: int, info: BatchInfo, samples: int) -> np.ndarray:
    """Slot ``j * P + b`` (b < samples) reads element ``b * size + idx[j]``; others nothing."""
    out = np.full((idx.shape[0], info.blocks), -1, dtype=np.int64)
    m = idx >= 0
    for b in range(samples):
        out[m, b] = idx[m] + b * size
    return out.reshape(-1)


def _batched_tables(small: LazyTables, plan: Mapping[str, Any], sizes: Mapping[str, int],
                    info: BatchInfo) -> LazyTables:
    io_tables: dict[str, str] = {}
    for d in plan["program"]:
        if d["op"] in ("input", "output"):
            io_tables[d["table"]] = d["tensor"]
    specs: dict[str, TableSpec] = {}
    for name in small.table_names():
        def gen(name: str = name) -> tuple[np.ndarray, np.ndarray | None]:
            idx = np.asarray(small[f"{name}.idx"])
            coef = np.asarray(small[f"{name}.coef"]) if f"{name}.coef" in small else None
            big_coef = None if coef is None else np.repeat(coef, info.blocks)
            if name in io_tables:
                return _spread_idx(idx, sizes[io_tables[name]], info, info.batch), big_coef
            return np.repeat(idx, info.blocks), big_coef

        specs[name] = TableSpec(name, gen)
    return LazyTables(specs)


def batched_layout(layout: Any, info: BatchInfo) -> MappedLayout:
    """A claim's layout over all ``P`` samples (the padding's zero samples included): a
    tensor of leading dimension ``P``."""
    size = int(np.prod(layout.shape))
    maps = np.stack([_spread_idx(np.asarray(layout.index_map(q)), size, info, info.blocks)
                     for q in range(layout.n_ct)])
    return MappedLayout.of((info.blocks, *layout.shape), maps, layout.clean, info.notation())


_DIM = re.compile(r"\[([^:\[\]]+):(\d+):(\d+)(<(\d+))?\]")


def batched_notation(notation: str, info: BatchInfo) -> str:
    """The one-sample layout's Rotom notation in the real ring: slot strides (and a
    replication's cut, a base offset) times ``P``, the batch ``[B:B:1]`` innermost."""
    if notation == "plaintext" or info.blocks == 1 and info.batch == 1:
        return notation if notation == "plaintext" else f"{notation}[B:1:1]"
    tail = "~" if notation.endswith("~") else ""
    body = notation[:-1] if tail else notation
    parts = body.split(";")

    def dim(m: re.Match[str]) -> str:
        cut = f"<{int(m.group(5)) * info.blocks}" if m.group(5) else ""
        return f"[{m.group(1)}:{m.group(2)}:{int(m.group(3)) * info.blocks}{cut}]"

    last = _DIM.sub(dim, parts[-1])
    last = re.sub(r"^\+(\d+)", lambda m: f"+{int(m.group(1)) * info.blocks}", last)
    last = re.sub(r"(\[[^\]]*\])\+(\d+)", lambda m: f"{m.group(1)}+{int(m.group(2)) * info.blocks}", last)
    return ";".join([*parts[:-1], last + info.notation()]) + tail


def plan_seconds_model(plan: Mapping[str, Any], params: Params) -> float | None:
    """Modelled seconds of a plan under the calibrated table of its preset (level aware, as
    ``slotplan lattigo-bench`` models it), or None without one."""
    from planner.cost.timing import plan_model

    tm = plan_model(plan, params)
    return None if tm is None else tm.program_seconds(list(plan["program"]), params.max_level, params.slots)


def plan_batched(graph: Graph, params: Params, options: PlanOptions, record_timings: bool = False,
                 wall_limit_s: float | None = None, wall_started: float | None = None) -> PlanResult:
    """Plan ``options.batch`` samples of ``graph`` (module docstring)."""
    from planner.ir.analysis import summarize
    from planner.lower.lowering import LayoutClaim
    from planner.single import PlanResult, plan_single

    assert options.batch is not None
    if options.packing != "real":
        raise BatchError("field 'batch': complex packing cannot be batched (plan with --packing real)")
    info = batch_geometry(params.slots, options.batch)
    named = [k for k in options.kernels if k.startswith("cins")]
    if named:
        raise BatchError(f"field 'batch': the CinS kernels ({', '.join(named)}) cannot be batched: their "
                         "registers are not slot vectors")
    from planner.frontend.params import check_security

    # the real ring's parameters are what must be secure (or a built-in preset, or allowed):
    # the block parameters share their chain and are no preset of their own
    check_security(params, options.allow_insecure)
    small_opts = replace(options, batch=None, memory_cap_bytes=None, cins=False, densify=True, densify_room=True,
                         allow_insecure=True)
    # a padded batch (B < P) with clean outputs: the output ciphertexts are masked to the B
    # real samples (one pmul and rescale each), so one level must be left for the mask
    pad_mask = options.clean_outputs and info.batch < info.blocks
    block = block_params(params, info.stride)
    res = plan_single(graph, block, small_opts, record_timings, wall_limit_s, wall_started)
    if pad_mask and not _mask_fits(res.plan, graph, block.max_level):
        # no level left for the mask: plan with one level reserved; when nothing fits then,
        # keep the plan and leave the padding samples' outputs (clean_outputs false)
        pad_mask = False
        if block.max_level >= 1:
            try:
                res = plan_single(graph, _reserve_level(block, info.stride), small_opts, record_timings, wall_limit_s,
                                 wall_started)
                pad_mask = True
            except PlanError:
                pass
    small = res.plan
    for i, d in enumerate(small["program"]):
        if d["op"] in REFUSED_OPS:
            raise BatchError(f"instruction {i} ({d['op']}): not supported in a batched plan")
    P = info.blocks
    claims = [LayoutClaim(c.what, c.tensor, batched_layout(c.layout, info), c.regs, c.scale) for c in res.claims]
    program = []
    for d in small["program"]:
        if d["op"] == "rot":
            d = {**d, "k": int(d["k"]) % info.stride * P}
        elif d["op"] == "rot_hoisted":
            d = {**d, "ks": [int(k) % info.stride * P for k in d["ks"]]}
        program.append(d)
    sizes = {t: math.prod(graph.shape(t)) for t in (*graph.inputs, *graph.outputs)}
    tables = _batched_tables(res.tables, small, sizes, info)
    nodes = [dict(n) for n in small["nodes"]]
    boot_summary = _real_bootstraps(program, nodes, small["summary"].get("bootstrapping"), block.variant_shift)
    plaintexts = dict(small["plaintexts"])
    masked = False
    if pad_mask:
        program, tables, masked = _mask_padding(program, nodes, plaintexts, tables, graph, info)
    summary = summarize(program, params, len(plaintexts))
    s0 = small["summary"]
    for key in ("solver", "plan_seconds", "bootstrapping", "insecure"):
        if key in s0:
            summary[key] = boot_summary if key == "bootstrapping" else s0[key]
    summary["memory_cap_bytes"] = options.memory_cap_bytes
    # padding samples (B < P) compute the network on a zero sample: their output slots are
    # masked to zero (clean outputs asked for), else left (clean_outputs false)
    summary["clean_outputs"] = bool(s0["clean_outputs"]) and (info.batch == P or masked)
    nodes = [{**n, "in_layouts": [batched_notation(x, info) for x in n["in_layouts"]],
              "out_layout": batched_notation(n["out_layout"], info)} for n in nodes]
    plan: dict[str, Any] = {
        **small,
        "params": params.to_json(),
        "options": options.to_json(),
        "summary": summary,
        "outputs": {t: [options.batch, *graph.shape(t)] for t in graph.outputs},
        "nodes": nodes,
        "plaintexts": plaintexts,
        "program": program,
    }
    if options.memory_cap_bytes is not None:
        from planner.keys.profile import KeyCapError
        from planner.keys.schedule import schedule_plan

        try:
            plan, _ = schedule_plan(plan, options.memory_cap_bytes, "joint", process=True,
                                    time_limit_s=options.time_limit_s)
        except KeyCapError as err:
            # the bootstrap variants' keys and DFT matrices do not fit the cap: leave out
            # those worth the least per byte and plan again, as planner.single does
            return _without_variants(graph, params, options, small, block, err, record_timings, wall_limit_s,
                                     wall_started)
    seconds = plan_seconds_model(plan, params)
    plan["summary"]["batch"] = options.batch
    plan["summary"]["per_sample"] = {
        "seconds": None if seconds is None else round(seconds / options.batch, 6),
        "rotations": round(plan["summary"]["rotations"] / options.batch, 6),
    }
    annotate(plan)  # the batched program's fused blocks (planner.ir.fused_plan)
    return PlanResult(plan, tables, res.solution, res.problem, res.seconds, claims, info)


def _without_variants(graph: Graph, params: Params, options: PlanOptions, small: Mapping[str, Any], block: Params,
                      err: Exception, record_timings: bool, wall_limit_s: float | None,
                      wall_started: float | None) -> PlanResult:
    """A batched plan whose key schedule does not fit the cap: planned again with fewer
    bootstrap variants (``planner.single.fewer_variants``, counted on the small plan's
    block ring, as its options take them); the error again when the small plan used none."""
    from planner.ir import boot_block
    from planner.keys.profile import KeyCapError
    from planner.single import fewer_variants, with_warning

    assert isinstance(err, KeyCapError)
    if not boot_block.variants_used(small["program"], block):
        raise err
    slim, why = fewer_variants(small, block, options, err)
    return with_warning(plan_batched(graph, params, slim, record_timings, wall_limit_s, wall_started), why)


def _output_regs(program: list[dict[str, Any]], graph: Graph) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in program:
        if d["op"] == "output" and graph.producer(d["tensor"]) is not None:
            out.setdefault(d["tensor"], []).append(d["src"])
    return out


def _mask_fits(plan: Mapping[str, Any], graph: Graph, max_level: int) -> bool:
    """Whether every output ciphertext has a level left for the padding mask."""
    from planner.ir.analysis import register_depths

    depth = register_depths(plan["program"])
    return all(depth[r] + 1 <= max_level for rs in _output_regs(plan["program"], graph).values() for r in rs)


def _reserve_level(block: Params, stride: int) -> Params:
    """The block parameters with one level fewer (the padding mask takes it)."""
    return BlockParams(block.log_n, block.log_q[:-1], block.log_p, block.log_scale, block.name, block.note,
                       block.boot, block_slots=stride, boot_shift=block.variant_shift)


def _mask_padding(program: list[dict[str, Any]], nodes: list[dict[str, Any]], plaintexts: dict[str, Any],
                  tables: LazyTables, graph: Graph, info: BatchInfo
                  ) -> tuple[list[dict[str, Any]], LazyTables, bool]:
    """Zero the padding samples' slots of every output ciphertext (B < P): after the span of
    the node that makes an output, one pmul by a mask (1 on the slots the output table names,
    which are the B real samples' only, 0 elsewhere) and one rescale per ciphertext; the
    output instructions read the masked registers.  The instructions join that node's span
    and counts.  Outputs that are graph inputs (no node) are left: returns False then."""
    regs = _output_regs(program, graph)
    out_tables = {d["src"]: d["table"] for d in program if d["op"] == "output"}
    span_of = {n["id"]: i for i, n in enumerate(nodes)}
    if any(graph.producer(t) is None for t in graph.outputs if graph.encrypted(t)):
        return program, tables, False
    n_reg = 1 + max(int(r[1:]) for d in program for r in ir_regs(d) if r[:1] == "c" and r[1:].isdigit())
    n_pt = 1 + max((int(p[1:]) for p in plaintexts if p[:1] == "p" and p[1:].isdigit()), default=-1)
    def keep(name: str) -> tuple[np.ndarray, np.ndarray | None]:
        return np.asarray(tables[f"{name}.idx"]), tables.get(f"{name}.coef")

    specs = {name: TableSpec(name, partial(keep, name)) for name in tables.table_names()}
    inserts: dict[int, list[dict[str, Any]]] = {}
    renamed: dict[str, str] = {}
    for t, rs in regs.items():
        ni = span_of[graph.producer(t).id]  # type: ignore[union-attr]
        for r in rs:
            table = f"pt/batch/pad/{out_tables[r]}"

            def coef(out_table: str = out_tables[r]) -> tuple[np.ndarray, np.ndarray]:
                idx = np.asarray(tables[f"{out_table}.idx"])
                return np.full(idx.shape, -1, dtype=np.int64), (idx >= 0).astype(np.float64)

            specs[table] = TableSpec(table, coef)
            pt = f"p{n_pt}"
            n_pt += 1
            plaintexts[pt] = {"source": "const", "table": table}
            m, o = f"c{n_reg}", f"c{n_reg + 1}"
            n_reg += 2
            inserts.setdefault(ni, []).extend([{"op": "pmul", "dst": m, "src": r, "pt": pt},
                                               {"op": "rescale", "dst": o, "src": m}])
            renamed[r] = o
            nodes[ni]["pmul"] += 1
            nodes[ni]["rescale"] += 1
    out: list[dict[str, Any]] = []
    shift = 0
    ends = {n["span"][1]: i for i, n in enumerate(nodes) if i in inserts}
    new_spans = []
    for i, n in enumerate(nodes):
        a, z = n["span"]
        extra = len(inserts.get(i, []))
        new_spans.append([a + shift, z + shift + extra])
        shift += extra
    for pos, d in enumerate(program):
        if pos in ends and ends[pos] in inserts:
            out.extend(inserts.pop(ends[pos]))
        out.append({**d, "src": renamed[d["src"]]} if d["op"] == "output" and d["src"] in renamed else d)
    for i in list(inserts):  # a span that ends the program
        out.extend(inserts.pop(i))
    for n, sp in zip(nodes, new_spans, strict=True):
        n["span"] = sp
    return out, LazyTables(specs), True


def ir_regs(d: Mapping[str, Any]) -> list[str]:
    from planner import ir

    ins = ir.decode(dict(d))
    return [*ins.reads(), *ins.writes()]


def batched_values(values: Mapping[str, np.ndarray], graph: Graph, samples: int) -> list[dict[str, np.ndarray]]:
    """Per-sample value sets of batched inputs (leading dimension ``samples``), weights shared."""
    out = []
    for b in range(samples):
        v = {t: np.asarray(values[t]) for t in graph.weights}
        for t in graph.inputs:
            x = np.asarray(values[t])
            v[t] = x[b] if b < x.shape[0] else np.zeros(graph.shape(t))
        out.append(v)
    return out


def batched_reference(graph: Graph, values: Mapping[str, np.ndarray], samples: int) -> dict[str, np.ndarray]:
    """The numpy reference per sample, stacked (samples past the inputs' count are zeros)."""
    from planner.frontend.reference import reference

    refs = [reference(graph, v) for v in batched_values(values, graph, samples)]
    return {t: np.stack([r[t] for r in refs]) for t in refs[0]}


def plan_auto_batch(graph: Graph, params: Params, options: PlanOptions, record_timings: bool = False,
                    wall_limit_s: float | None = None, wall_started: float | None = None) -> PlanResult:
    """``--batch auto``: plan B = 1, 2, 4, ... (powers of two that fit the slots, each under
    the memory cap) and keep the plan with the least modelled seconds per sample (rotations
    per sample without a calibrated table).  Every power of two up to the slots is planned
    (modelled time per sample need not fall monotonically: LoLa's rises from B = 2 to 4 and
    falls again); the search stops early only at a B that no longer fits once a smaller one
    did (a smaller block fits even less).  ``summary.batch_auto`` lists every candidate."""
    best: PlanResult | None = None
    rows: list[dict[str, Any]] = []
    B = 1

    def key(r: PlanResult) -> float:
        ps = r.plan["summary"]["per_sample"]
        return float(ps["seconds"] if ps["seconds"] is not None else ps["rotations"])

    while params.slots >= B:
        try:
            r = plan_batched(graph, params, replace(options, batch=B), record_timings, wall_limit_s, wall_started)
        except PlanError as e:
            rows.append({"batch": B, "refused": str(e)})
            if best is not None:
                break
            B *= 2
            continue
        rows.append({"batch": B, **r.plan["summary"]["per_sample"]})
        if best is None or key(r) < key(best):
            best = r
        B *= 2
    if best is None:
        raise BatchError(f"field 'batch': no batch fits ({rows[-1]['refused'] if rows else 'no candidate'})")
    best.plan["summary"]["batch_auto"] = {"chosen": best.plan["summary"]["batch"], "candidates": rows}
    return best

"""A plan executor written only from shared/SPEC.md section 4, with json and numpy alone
(no slotplan import): the contract that a third party can run our plan files."""

from __future__ import annotations

import json
import sys

import numpy as np


def execute(plan: dict, tables: dict, values: dict) -> dict:
    S = plan["params"]["slots"]
    R: dict = {}

    def tab(name: str) -> tuple:
        return tables[name + ".idx"], tables.get(name + ".coef")

    def pt_vec(p: dict) -> np.ndarray:
        idx, coef = tab(p["table"])
        if p["source"] == "const":
            v = np.ones(S)
        else:
            flat = values[p["source"]].ravel()
            v = np.where(idx >= 0, flat[np.maximum(idx, 0)], 0.0)
        return v * coef if coef is not None else v

    outs: dict = {}
    for ins in plan["program"]:
        op = ins["op"]
        if op == "input":
            idx, _ = tab(ins["table"])
            flat = values[ins["tensor"]].ravel()
            R[ins["dst"]] = np.where(idx >= 0, flat[np.maximum(idx, 0)], 0.0)
        elif op == "rot":
            R[ins["dst"]] = np.roll(R[ins["src"]], -ins["k"])
        elif op == "rot_hoisted":
            for d, k in zip(ins["dsts"], ins["ks"], strict=True):
                R[d] = np.roll(R[ins["src"]], -k)
        elif op in ("add", "sub", "cmul"):
            a, b = R[ins["a"]], R[ins["b"]]
            R[ins["dst"]] = {"add": a + b, "sub": a - b, "cmul": a * b}[op]
        elif op in ("pmul", "padd", "psub"):
            v = pt_vec(plan["plaintexts"][ins["pt"]])
            x = R[ins["src"]]
            R[ins["dst"]] = {"pmul": x * v, "padd": x + v, "psub": x - v}[op]
        elif op == "poly" and ins.get("basis") == "chebyshev":
            a, b = ins["domain"]
            t = (2 * R[ins["src"]] - a - b) / (b - a)
            R[ins["dst"]] = np.polynomial.chebyshev.chebval(t, ins["coeffs"])
        elif op == "poly":
            x = R[ins["src"]]
            R[ins["dst"]] = sum(c * x**i for i, c in enumerate(ins["coeffs"]))
        elif op == "rescale":
            R[ins["dst"]] = R[ins["src"]]
        elif op in ("load_key", "drop_key"):
            pass
        elif op == "output":
            idx, _ = tab(ins["table"])
            y = outs.setdefault(ins["tensor"], {})
            for s in np.nonzero(idx >= 0)[0]:
                y[int(idx[s])] = R[ins["src"]][s]
        else:
            raise ValueError(op)
    return {t: np.array([d[i] for i in range(len(d))]) for t, d in outs.items()}


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        plan = json.load(fh)
    tables = dict(np.load(sys.argv[2]))
    vals = dict(np.load(sys.argv[3]))
    res = execute(plan, tables, vals)
    np.savez(sys.argv[4], **res)

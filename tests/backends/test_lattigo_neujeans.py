"""NeuJeans on Lattigo at ``n14boot`` (N16QP1546H192H32 at log N 14, insecure; ~3 GB, ~1-2 min):
planner/layout/cins.py's CinS encoding and slot order checked on encrypted data, and the fused
conv + SlotsToCoeffs layer against numpy's conv2d (backends/lattigo_neujeans.py, Go
``NeujeansLayers``).

1. ``bootstrap_cins`` order: the client encrypts ``cins.cins_slot_vector(m, l)``; Lattigo
   runs S_(N/2<-l), ScaleDown, ModUp, CoeffsToSlots, EvalMod; the decrypted Re/Im pair must
   be ``cins.bootstrap_cins(m, l)`` (bit-reversed pair order).
2. A 3x3 conv of 16 channels of 31x31 images in ``cins_layout_for``'s layout (l=512, w=32):
   input = the layout's Re/Im pair (``cins.bootstrap_cins``), S_(l<-1) (to_cins), the conv
   folded into S_(N/2<-l) (2 sqrt(16) - 2 = 6 rotations, one level), bootstrap; the result,
   read back through ``cins.to_cins`` and the layout's index map, must equal numpy's conv2d.

Skipped when the extension is not built or less than 4 GiB of memory is available.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.lattigo_backend import available
from backends.lattigo_neujeans import NeujeansLayer, run_neujeans_layers
from planner.frontend.params import preset
from planner.layout import cins
from tests.helpers import mem_available

pytestmark = [
    pytest.mark.skipif(not available(), reason="Lattigo extension not built (make lattigo)"),
    pytest.mark.skipif(mem_available() < 4 << 30, reason="a bootstrap at log N 14 needs ~3 GB of memory"),
]

P = preset("n14boot")
S = P.slots
N = 2 * S


def _conv2d(x: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Same-padded cross-correlation (torch's conv2d), float64."""
    f = K.shape[-1]
    p = f // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    H, W = x.shape[1:]
    out = np.zeros((K.shape[0], H, W))
    for a in range(f):
        for b in range(f):
            out += np.einsum("oi,ihw->ohw", K[:, :, a, b], xp[:, a:a + H, b:b + W])
    return out


def _kernel_diagonals(K: np.ndarray, l: int, w: int) -> np.ndarray:  # noqa: E741
    """Diagonal d, slice i: sum_ab K[i, (i+d) mod C, a, b] Y^(-e), e = (a-f/2) w + (b-f/2)."""
    C, f = K.shape[0], K.shape[-1]
    L = 2 * l
    out = np.zeros((C, C * L))
    for d in range(C):
        for i in range(C):
            k = K[i, (i + d) % C]
            for a in range(f):
                for b in range(f):
                    e = (a - f // 2) * w + (b - f // 2)
                    if e <= 0:
                        out[d, i * L - e] += k[a, b]
                    else:
                        out[d, i * L + L - e] -= k[a, b]
    return out


def test_neujeans_order_and_fused_conv_n14boot() -> None:
    rng = np.random.default_rng(13)
    # 1. the order of bootstrap_cins
    l_order = 128
    m = rng.uniform(-1, 1, N)
    # 2. the fused conv layer
    C, H = 16, 31
    lay = cins.cins_layout_for((C, H, H), S, reach=(1, 1, 1, 1))
    assert (lay.l, lay.w, lay.cpc, lay.n_ct) == (512, 32, 16, 1)
    x = rng.uniform(-1, 1, (C, H, H))
    K = rng.uniform(-1, 1, (C, C, 3, 3))
    ref = _conv2d(x, K)
    K *= 0.9 / np.abs(ref).max()
    ref *= 0.9 / np.abs(ref).max()
    idx = lay.index_map(0)
    mx = np.where(idx >= 0, x.ravel()[np.maximum(idx, 0)], 0.0)
    res = run_neujeans_layers(P, [
        NeujeansLayer(l=l_order, cins_slots=cins.cins_slot_vector(m, l_order)),
        NeujeansLayer(l=lay.l, pair=cins.bootstrap_cins(mx, lay.l), kernel=_kernel_diagonals(K, lay.l, lay.w),
                      fused=True, to_cins_levels=2),
    ])
    # 1.
    want_re, want_im = cins.bootstrap_cins(m, l_order)
    got_re, got_im = res.pairs[0]
    err = max(np.abs(got_re - want_re).max(), np.abs(got_im - want_im).max())
    assert err < 2.0**-20, f"bootstrap_cins order: max error {err:.3g}"
    # a wrong order is far off: the same output against the natural (not bit-reversed) order
    nat = m.reshape(-1, 2 * l_order)
    assert np.abs(got_re - nat[:, :l_order].ravel()).max() > 0.1
    # 2.
    out = cins.to_cins(*res.pairs[1], lay.l)
    got = np.zeros(ref.size)
    got[idx[idx >= 0]] = out[idx >= 0]
    err2 = np.abs(got - ref.ravel()).max()
    assert err2 < 2.0**-20, f"fused conv: max error {err2:.3g} vs conv2d"
    st = res.stats[1]
    conv = next(s for s in st["steps"] if s["name"] == "conv")
    assert conv["rotations"] == 2 * 4 - 2 == st["conv_rotations"]
    assert conv["level_in"] - conv["level_out"] == 1 == st["conv_levels"]
    assert res.keys["extra_count"] == len(res.keys["extra"])
    print(f"order err {err:.3g} ({-np.log2(err):.1f} bits); fused conv err {err2:.3g} ({-np.log2(err2):.1f} bits); "
          f"stats {st}; keys {res.keys}; total {res.raw['total_seconds']:.1f} s, peak RSS {res.raw['peak_rss_bytes']}")

"""MetaKernel's rotation-count formulas (pure integer arithmetic).

They live in the solver layer because both sides use them: the IMRA kernel
(``planner/kernels/imra.py``) searches Eq. 11 exhaustively and the constraint model
(``solver/imra_model.py``) states it; the solver may not import the planner.
"""

from __future__ import annotations


def gamma(m: int) -> int:
    """MetaKernel's gamma(m) (section 4.1.2): rotations for replicating m times as the sum
    of the bit positions of the ones of m plus their number minus one; gamma(9) = 4."""
    if m <= 1:
        return 0
    return sum(i for i in range(m.bit_length()) if m >> i & 1) + bin(m).count("1") - 1


def eq11(nd: int, T: int, Pb: int, Ps: int) -> int:
    """Eq. 11: gamma(Ps + 1) + (nd*T/Pb - 1) + (Pb/Ps - 1) + (Ps - 1).

    rot(A_rep^b) is 0 here: the input row is the ciphertext itself (the replication to
    kd/k copies is part of the Ps + 1 horizontal copies, both are one doubling chain).
    """
    return gamma(Ps + 1) + (nd * T // Pb - 1) + (Pb // Ps - 1) + (Ps - 1)

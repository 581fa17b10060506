"""A toy of a block-cyclic code with its own knobs, for the knob tests: a P x Q process grid
(which must hold every rank), a block size NB and a summation algorithm. Every rank sums the
blocks of an n x n matrix that the block-cyclic map gives it; rank 0 prints the time and the
relative error against the closed form."""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, required=True)
parser.add_argument("--nb", type=int, required=True)
parser.add_argument("--p", type=int, required=True)
parser.add_argument("--q", type=int, required=True)
parser.add_argument("--algo", choices=("pairwise", "sequential"), required=True)
args = parser.parse_args()
comm = MPI.COMM_WORLD
if comm.Get_size() != args.p * args.q:
    print(f"grid {args.p}x{args.q} needs {args.p * args.q} ranks, not {comm.Get_size()}",
          file=sys.stderr)  # fmt: skip
    sys.exit(2)
row, col = divmod(comm.Get_rank(), args.q)
n, nb = args.n, args.nb
matrix = np.arange(n * n, dtype=np.float64).reshape(n, n)
comm.Barrier()
start = time.perf_counter()
local = 0.0
for bi in range(row, math.ceil(n / nb), args.p):
    for bj in range(col, math.ceil(n / nb), args.q):
        block = matrix[bi * nb : (bi + 1) * nb, bj * nb : (bj + 1) * nb]
        if args.algo == "pairwise":
            local += float(block.sum())
        else:
            for value in block.ravel():
                local += float(value)
total = comm.allreduce(local)
elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
exact = n * n * (n * n - 1) / 2
if comm.Get_rank() == 0:
    print(f"time={elapsed:.6e} error={abs(total - exact) / exact:.3e}")

"""Arithmetic in GF(2^8) (polynomial 0x11d): tables, matrix inversion, the coding matrix."""

from __future__ import annotations

import numpy as np

from ray_ckpt.config import MAX_SHARDS

POLYNOMIAL = 0x11D


def _build_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    exp = np.zeros(512, dtype=np.uint8)
    log = np.zeros(256, dtype=np.int32)
    value = 1
    for power in range(255):
        exp[power] = value
        log[value] = power
        value <<= 1
        if value & 0x100:
            value ^= POLYNOMIAL
    exp[255:510] = exp[0:255]
    a = np.arange(256).reshape(256, 1)
    b = np.arange(256).reshape(1, 256)
    mul = exp[(log[a] + log[b]) % 255].astype(np.uint8)
    mul[0, :] = 0
    mul[:, 0] = 0
    return exp, log, mul


EXP, LOG, MUL_TABLE = _build_tables()


def mul(a: int, b: int) -> int:
    """The product a*b in GF(2^8)."""
    return int(MUL_TABLE[a, b])


def inv(a: int) -> int:
    """The multiplicative inverse of a non-zero element."""
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(2^8)")
    return int(EXP[255 - LOG[a]])


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Matrix product over GF(2^8) of small uint8 matrices."""
    rows, inner = a.shape
    inner_b, cols = b.shape
    if inner != inner_b:
        raise ValueError(f"cannot multiply {a.shape} by {b.shape}")
    out = np.zeros((rows, cols), dtype=np.uint8)
    for i in range(inner):
        out ^= MUL_TABLE[a[:, i].reshape(rows, 1), b[i, :].reshape(1, cols)]
    return out


def invert(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a square matrix over GF(2^8) by Gauss-Jordan; ValueError if singular."""
    size = matrix.shape[0]
    if matrix.shape != (size, size):
        raise ValueError(f"matrix must be square, got {matrix.shape}")
    work = np.concatenate([matrix.astype(np.uint8), np.eye(size, dtype=np.uint8)], axis=1)
    for col in range(size):
        pivots = np.nonzero(work[col:, col])[0]
        if len(pivots) == 0:
            raise ValueError("matrix is singular over GF(2^8)")
        pivot = col + int(pivots[0])
        if pivot != col:
            work[[col, pivot]] = work[[pivot, col]]
        work[col] = MUL_TABLE[inv(int(work[col, col])), work[col]]
        for row in range(size):
            factor = int(work[row, col])
            if row != col and factor:
                work[row] ^= MUL_TABLE[factor, work[col]]
    return work[:, size:].copy()


def parity_matrix(data_shards: int, parity_shards: int) -> np.ndarray:
    """The m x k parity rows of a systematic MDS code.

    A Cauchy matrix 1 / (x_i + y_j) with x_i = k + i and y_j = j has every square submatrix
    invertible, so [I; C] decodes from any k rows. Scaling its columns keeps that property; we
    scale so that the first parity row is all ones, which makes m = 1 plain XOR and the first
    parity of every code an XOR too (the cheapest row to encode).
    """
    k, m = data_shards, parity_shards
    if k + m > MAX_SHARDS:
        raise ValueError(f"data_shards + parity_shards must be <= {MAX_SHARDS} in GF(2^8)")
    cauchy = np.zeros((m, k), dtype=np.uint8)
    for i in range(m):
        for j in range(k):
            cauchy[i, j] = inv((k + i) ^ j)
    if m:
        for j in range(k):
            scale = inv(int(cauchy[0, j]))
            cauchy[:, j] = MUL_TABLE[scale, cauchy[:, j]]
    return cauchy


def dot_numpy(
    coefficients: np.ndarray,
    inputs: list[np.ndarray],
    outputs: list[np.ndarray],
    start: int,
    stop: int,
) -> None:
    """Portable (slow) kernel with the contract of the compiled one: for each row r,
    outputs[r][start:stop] = XOR_c coefficients[r, c] * inputs[c][start:stop]."""
    for r, out in enumerate(outputs):
        acc = np.zeros(stop - start, dtype=np.uint8)
        for c, data in enumerate(inputs):
            k = int(coefficients[r, c])
            if k == 1:
                acc ^= data[start:stop]
            elif k:
                acc ^= MUL_TABLE[k][data[start:stop]]
        out[start:stop] = acc

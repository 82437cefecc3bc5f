"""Random weights in every ggml format, for synthetic models: the codes are
random bytes and the scale fields are set so that the weights come out near
zero mean with the asked-for root-mean-square, as quantized trained weights
do. Formats with a minimum per sub-block get minimum = -(middle code) x
scale, so each sub-block is centred. The layouts are ggml's (ggml-common.h);
gguf-py's dequantize reads every one of them (tests/test_kernels.py)."""
from __future__ import annotations

import numpy as np

from .gguf import BLOCK_SIZES, GGMLType

Q = GGMLType

# Root-mean-square of the doubled FP4 values over the 16 codes, of int8, and
# of IQ4_NL's value table.
_MXFP4_RMS = float(np.sqrt(np.mean(np.array([0, 1, 2, 3, 4, 6, 8, 12] * 2, dtype=np.float64) ** 2)))
_INT8_RMS = float(np.sqrt(np.mean(np.arange(-128, 128, dtype=np.float64) ** 2)))
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float64)
_IQ4_RMS = float(np.sqrt(np.mean(_IQ4_VALUES ** 2)))


def _uniform_rms(n_codes: int) -> float:
    """RMS of codes uniform over n_codes values, centred."""
    c = np.arange(n_codes) - (n_codes - 1) / 2
    return float(np.sqrt(np.mean(c ** 2)))


def _f16(x) -> np.ndarray:
    return np.asarray(x, dtype="<f2").view(np.uint8).reshape(-1, 2)


def _jitter(rng, n: int) -> np.ndarray:
    return rng.uniform(0.75, 1.25, n)


def _pack_k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and minimums ([n, 8] each):
    the inverse of ggml's get_scale_min_k4."""
    out = np.zeros((len(sc), 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] & 63
    out[:, 4:8] = mn[:, 0:4] & 63
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    out[:, 0:4] |= (sc[:, 4:8] >> 4) << 6
    out[:, 4:8] |= (mn[:, 4:8] >> 4) << 6
    return out


def blocks(t: GGMLType, rng: np.random.Generator, n_blocks: int, rms: float) -> np.ndarray:
    """n_blocks random blocks of type t (bytes, [n_blocks, block bytes]); for
    the float types n_blocks values."""
    t = GGMLType(t)
    _, size = BLOCK_SIZES[t]
    if t in (Q.F32, Q.F16, Q.BF16):
        x = (rms * rng.standard_normal(n_blocks)).astype(np.float32)
        if t == Q.F32:
            return x.view(np.uint8).reshape(-1, 4)
        if t == Q.F16:
            return _f16(x)
        bits = x.view(np.uint32)                   # to BF16, rounding to nearest even
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.astype("<u2").view(np.uint8).reshape(-1, 2)
    b = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    if t != Q.MXFP4:
        j = _jitter(rng, n_blocks)   # (drawn after the codes: the stream synthetic files were always drawn in)
    if t == Q.MXFP4:
        e = int(round(128 + np.log2(rms / _MXFP4_RMS)))
        b[:, 0] = np.clip(e + rng.integers(-1, 2, n_blocks), 1, 254)
    elif t == Q.Q8_0:
        b[:, :2] = _f16(rms / _INT8_RMS * j)
    elif t in (Q.Q4_0, Q.IQ4_NL):
        b[:, :2] = _f16(rms / (_uniform_rms(16) if t == Q.Q4_0 else _IQ4_RMS) * j)
    elif t in (Q.Q4_1, Q.Q5_1):
        n = 16 if t == Q.Q4_1 else 32
        d = rms / _uniform_rms(n) * j
        b[:, :2], b[:, 2:4] = _f16(d), _f16(-(n - 1) / 2 * d)
    elif t == Q.Q5_0:
        b[:, :2] = _f16(rms / _uniform_rms(32) * j)
    elif t == Q.Q2_K:               # scales[16], qs[64], d, dmin: scale = minimum per sub-block
        sc = rng.integers(8, 16, (n_blocks, 16)).astype(np.uint8)
        b[:, :16] = sc | (sc << 4)
        d = rms / (_uniform_rms(4) * 11.5) * j
        b[:, 80:82], b[:, 82:84] = _f16(d), _f16(1.5 * d)
    elif t == Q.Q3_K:               # hmask[32], qs[64], scales[12], d: signed 6-bit scales
        b[:, 108:110] = _f16(rms / (_uniform_rms(8) * 18.5) * j)
    elif t in (Q.Q4_K, Q.Q5_K):     # d, dmin, scales[12], ...
        n = 16 if t == Q.Q4_K else 32
        sc = rng.integers(32, 64, (n_blocks, 8)).astype(np.uint8)
        b[:, 4:16] = _pack_k4_scales(sc, sc)
        d = rms / (_uniform_rms(n) * 47.5) * j
        b[:, 0:2], b[:, 2:4] = _f16(d), _f16((n - 1) / 2 * d)
    elif t == Q.Q6_K:               # ql[128], qh[64], scales[16] (int8), d
        sc = rng.integers(32, 128, (n_blocks, 16)) * rng.choice([-1, 1], (n_blocks, 16))
        b[:, 192:208] = sc.astype(np.int8).view(np.uint8)
        b[:, 208:210] = _f16(rms / (_uniform_rms(64) * 85) * j)
    elif t == Q.IQ4_XS:             # d, scales_h, scales_l[4], qs[128]: 6-bit scales minus 32
        b[:, 0:2] = _f16(rms / (_IQ4_RMS * 18.5) * j)
    else:
        raise ValueError(f"no random blocks for {t.name}")
    return b

"""Native dequantization, both implementations, bit-exact against gguf-py."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants

from goosedump import _kernels

IMPLS = _kernels.available_impls()


def random_q8_0(rng, n_blocks):
    raw = rng.integers(-128, 128, size=(n_blocks, 34), dtype=np.int16).astype(np.int8).view(np.uint8)
    # scales across the fp16 range, subnormals and zero included
    d = np.concatenate([rng.standard_normal(n_blocks - 3) * 10.0 ** rng.integers(-7, 3, n_blocks - 3),
                        [0.0, 6e-8, -65504.0]]).astype("<f2")
    raw[:, :2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def random_mxfp4(rng, n_blocks):
    raw = rng.integers(0, 256, size=(n_blocks, 17), dtype=np.uint8)
    raw[:3, 0] = [0, 1, 254]  # extreme exponents: 2^-128 is a float subnormal
    return raw.reshape(-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_blocks", [3, 4, 33, 1000])
@pytest.mark.parametrize("fmt,make,qtype", [("q8_0", random_q8_0, QT.Q8_0),
                                             ("mxfp4", random_mxfp4, QT.MXFP4)])
def test_dequantize_matches_gguf_py(impl, n_blocks, fmt, make, qtype):
    rng = np.random.default_rng(n_blocks)
    raw = make(rng, n_blocks)
    with np.errstate(over="ignore"):  # exponent 254 times 6.0 is inf, in ggml too
        expect = quants.dequantize(raw, qtype).reshape(-1)
    out = np.empty(n_blocks * 32, np.float32)
    _kernels.dequantize(fmt, raw, out, impl)
    np.testing.assert_array_equal(out.view(np.uint32), expect.astype(np.float32).view(np.uint32))


def test_dequantize_rejects_bad_sizes():
    with pytest.raises(ValueError, match="not a whole number of 34-byte blocks"):
        _kernels.dequantize("q8_0", np.zeros(35, np.uint8), np.zeros(32, np.float32))
    with pytest.raises(ValueError, match="output holds 31 floats, expected 32"):
        _kernels.dequantize("mxfp4", np.zeros(17, np.uint8), np.zeros(31, np.float32))
    with pytest.raises(ValueError, match="format must be"):
        _kernels.dequantize("q4_2", np.zeros(18, np.uint8), np.zeros(32, np.float32))
    with pytest.raises(ValueError, match="impl must be"):
        _kernels.dequantize("q8_0", np.zeros(34, np.uint8), np.zeros(32, np.float32), "sse9")


@pytest.mark.parametrize("impl", IMPLS)
def test_peak_rate_names_the_paths_instruction(impl):
    """The yardstick benchmarks/vs_llamacpp.py sets prefill against: a rate,
    the instruction the path's int16 products use and its MACs."""
    rate, instruction, per = _kernels.peak_int16_macs(impl, 100000)
    assert rate > 0
    assert (instruction, per) == {"generic": ("scalar multiply-add", 1), "avx2": ("vpmaddwd ymm (+ vpaddd)", 16),
                                  "avx512": ("vpmaddwd zmm (+ vpaddd)", 32),
                                  "neon": ("smlal/smlal2 (int16 -> int32)", 4)}[impl]
    with pytest.raises(ValueError, match="impl must be"):
        _kernels.peak_int16_macs("sse9", 10)


def test_the_amx_peak_is_measured_where_the_tiles_run():
    rate, instruction, per = _kernels.peak_amx_macs(20000)
    assert (instruction, per) == ("tdpbf16ps (AMX; an int16 product takes two bf16 ones)", 4096)
    if _kernels.cpu_has_amx() and _kernels.active_impl() == "avx512":
        # the tiles' products outrun the vector unit's widest int16 instruction
        assert rate > 2 * _kernels.peak_int16_macs("avx512", 200000)[0]
    else:
        assert rate == 0


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, (1 << 20) + 77, 3 * (1 << 20) + 5])
def test_the_bandwidth_probe_reads_every_byte(n):
    # stream_read sums the buffer's 64-bit words, then the bytes past the last
    # whole 64: a byte it skipped (a chunk, the tail) would change the sum
    buf = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    body = n - n % 64
    with np.errstate(over="ignore"):
        expected = buf[:body].view("<u8").sum(dtype=np.uint64) + buf[body:].sum(dtype=np.uint64)
    before = _kernels.num_threads()
    try:
        for threads in (1, 2):
            _kernels.set_num_threads(threads)
            assert _kernels.stream_read(buf) == int(expected)
    finally:
        _kernels.set_num_threads(before)

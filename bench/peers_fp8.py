"""The fp8 KV cache of bench/peers.py's paged shapes (a shape's `kv_dtype`: `e4m3` or `e5m2`),
quantised the way `attnforge bench` quantises its own (cli/src/bench/fp8.rs): one scale per
tensor, scale = max|x| / the format's largest finite value, codes = x / scale rounded to the
format (clamped to its finite range first, so nothing becomes NaN or inf). The peers are given
the codes and the scales; the reference reads the dequantised cache, codes * scale, in float64.

torch is passed in, never imported here. The self-test runs without torch: a stand-in tensor of
plain Python floats whose fp8 conversion is this module's model of the formats (round to nearest,
ties to even, subnormals included) checks the scale, the codes and the dequantisation.
"""

from collections import namedtuple

Fp8Format = namedtuple("Fp8Format", "torch_name exp_bits man_bits bias max_finite")
# e4m3 is the "fn" variant (no infinities, one NaN code: its largest finite value keeps the top
# exponent with mantissa 110); e5m2 follows IEEE (the top exponent holds inf and NaN).
FP8_FORMATS = {
    "e4m3": Fp8Format("float8_e4m3fn", 4, 3, 7, 448.0),
    "e5m2": Fp8Format("float8_e5m2", 5, 2, 15, 57344.0),
}
MIN_SCALE = 2.0 ** -126  # an all-zero tensor still gets a positive scale (f32::MIN_POSITIVE)


def fp8_format(kv_dtype):
    """The format of a shape's kv_dtype; ValueError for an unknown name."""
    if kv_dtype not in FP8_FORMATS:
        raise ValueError(f"kv_dtype {kv_dtype!r} is not an fp8 format "
                         f"({', '.join(FP8_FORMATS)})")
    return FP8_FORMATS[kv_dtype]


def scale_for(max_abs, fmt):
    """The per-tensor scale of a tensor whose largest magnitude is max_abs."""
    return max(max_abs / fmt.max_finite, MIN_SCALE)


def quantise(torch, x, kv_dtype):
    """(codes, scale): x (any float dtype) as codes of the fp8 format kv_dtype, in torch's fp8
    dtype, and the Python float scale with x ~ codes * scale."""
    fmt = fp8_format(kv_dtype)
    scale = scale_for(float(x.abs().max()), fmt)
    codes = (x.float() / scale).clamp(-fmt.max_finite, fmt.max_finite)
    return codes.to(getattr(torch, fmt.torch_name)), scale


def dequantise(torch, codes, scale):
    """The values the codes stand for, in float64: what a peer given (codes, scale) computes on."""
    return codes.to(torch.float64) * scale


# ----------------------------------------------------------------------------------------------
# Self-test, on a stand-in of the few torch calls above.


def round_to_format(value, fmt):
    """value rounded to the nearest value of fmt (ties to even); a model of torch's conversion
    for values inside the finite range."""
    if value == 0.0:
        return 0.0
    sign, mag = (-1.0 if value < 0 else 1.0), abs(value)
    min_normal_exp = 1 - fmt.bias
    exp = min_normal_exp
    while mag >= 2.0 ** (exp + 1):
        exp += 1
    while exp > min_normal_exp and mag < 2.0 ** exp:
        exp -= 1
    step = 2.0 ** (exp - fmt.man_bits)  # the spacing of the binade (of the subnormals below it)
    return sign * round(mag / step) * step  # Python's round() breaks ties to even


def largest_finite(fmt):
    """The largest finite value from the format's bits: e4m3fn gives up only the all-ones code
    (its top exponent keeps mantissas up to 110); e5m2 gives the whole top exponent to inf/NaN."""
    top = 2 ** fmt.exp_bits - 1
    if fmt.torch_name.endswith("fn"):
        return 2.0 ** (top - fmt.bias) * (2.0 - 2.0 ** (1 - fmt.man_bits))
    return 2.0 ** (top - 1 - fmt.bias) * (2.0 - 2.0 ** -fmt.man_bits)


class _Dtype:
    def __init__(self, name, fmt=None):
        self.name, self.fmt = name, fmt


class _Tensor:
    """A flat list of floats with the operations quantise and dequantise use."""

    def __init__(self, values, dtype):
        self.values, self.dtype = list(values), dtype

    def abs(self):
        return _Tensor([abs(x) for x in self.values], self.dtype)

    def max(self):
        return max(self.values)

    def float(self):
        return _Tensor(self.values, _TORCH.float32)

    def __truediv__(self, s):
        return _Tensor([x / s for x in self.values], self.dtype)

    def __mul__(self, s):
        return _Tensor([x * s for x in self.values], self.dtype)

    def clamp(self, lo, hi):
        return _Tensor([min(max(x, lo), hi) for x in self.values], self.dtype)

    def to(self, dtype):
        if dtype.fmt is None:
            return _Tensor(self.values, dtype)
        return _Tensor([round_to_format(x, dtype.fmt) for x in self.values], dtype)


class _FakeTorch:
    def __init__(self):
        self.float32, self.float64 = _Dtype("float32"), _Dtype("float64")
        for fmt in FP8_FORMATS.values():
            setattr(self, fmt.torch_name, _Dtype(fmt.torch_name, fmt))


_TORCH = _FakeTorch()


def self_test():
    """Checks the formats, the rounding model, quantise and dequantise on the stand-in; returns
    True when every check passes."""
    failures = []

    def check(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(what)

    print("fp8 cache:")
    for name, fmt in FP8_FORMATS.items():
        check(fmt.max_finite == largest_finite(fmt),
              f"{name}: largest finite value {fmt.max_finite:g} from its bits")
        check(round_to_format(fmt.max_finite, fmt) == fmt.max_finite
              and getattr(_TORCH, fmt.torch_name).fmt is fmt, f"{name}: torch.{fmt.torch_name}")
    e4m3, e5m2 = FP8_FORMATS["e4m3"], FP8_FORMATS["e5m2"]
    check([round_to_format(x, e4m3) for x in (17.0, 19.0, -0.3, 2.0 ** -10, 3 * 2.0 ** -10)]
          == [16.0, 20.0, -0.3125, 0.0, 2.0 ** -8], "e4m3 rounding: ties to even, subnormals")
    check([round_to_format(x, e5m2) for x in (5.5, 7.5, 2.0 ** -17)] == [6.0, 8.0, 0.0],
          "e5m2 rounding: ties to even, subnormals")

    # Values on the e4m3 grid times a power of two: the codes are exact, so the dequantised
    # cache must give the values back exactly (a scale divided instead of multiplied, forgotten,
    # or taken from the wrong largest value all break this).
    unit = 2.0 ** -5
    grid = [416.0, -3.5, 0.0, 1.125, -0.015625, 2.0 ** -9, 240.0, -448.0]
    x = _Tensor([g * unit for g in grid], _Dtype("float16"))
    codes, scale = quantise(_TORCH, x, "e4m3")
    check(scale == unit and codes.dtype is _TORCH.float8_e4m3fn,
          f"scale = max|x| / 448 ({scale!r}), codes in float8_e4m3fn")
    check(codes.values == grid, "codes = x / scale")
    back = dequantise(_TORCH, codes, scale)
    check(back.dtype is _TORCH.float64 and back.values == x.values,
          "dequantised cache = codes * scale, exactly")

    # Values off the grid: every value within half a step of the dequantised one, the largest at
    # the top code, nothing past it.
    for name, fmt in FP8_FORMATS.items():
        values = [((i * 7919) % 2003 - 1001) / 97.0 for i in range(400)]
        codes, scale = quantise(_TORCH, _Tensor(values, _Dtype("float16")), name)
        back = dequantise(_TORCH, codes, scale).values
        half_step = [max(abs(v) * 2.0 ** -(fmt.man_bits + 1),
                         scale * 2.0 ** (-fmt.bias - fmt.man_bits)) for v in values]
        close = all(abs(b - v) <= h * (1 + 1e-12) for b, v, h in zip(back, values, half_step))
        top = max(abs(c) for c in codes.values)
        check(close and top == fmt.max_finite,
              f"{name}: within half a step of x, largest |code| {top:g}")
    zero, zscale = quantise(_TORCH, _Tensor([0.0, -0.0], _Dtype("float16")), "e4m3")
    check(zscale == MIN_SCALE and zero.values == [0.0, 0.0], "an all-zero tensor: codes 0")
    try:
        fp8_format("e3m4")
        refused = False
    except ValueError:
        refused = True
    check(refused, "an unknown kv_dtype is refused")
    print(f"fp8 self-test: {'PASS' if not failures else f'FAIL ({len(failures)})'}")
    return not failures

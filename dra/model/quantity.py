"""Kubernetes resource quantities, parsed and compared exactly like k8s.io/apimachinery.

A quantity is a decimal number with an optional suffix: binary (Ki .. Ei), decimal SI
(n u m k M G T P E) or a decimal exponent (``1e3``, ``1E-3``).  Values are kept exact.

Kubernetes stores a quantity either as a small ``int64`` scaled by a power of ten or as
an arbitrary-precision decimal, and a few operations depend on which one it picked: for
example ``asInteger()`` fails for ``1.5Ki`` (stored as a decimal) although the value is
1536.  ``Quantity`` tracks the same representation so that CEL sees the same answers.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# Decimal-form quantities are rounded up to nano precision when parsed.
_NANO_DIGITS = 9
# Guard against expressions such as 1e2147483647 + 1 making us build enormous integers;
# Kubernetes itself would need gigabytes for them.
_MAX_MATERIALIZED_EXPONENT = 100_000

DECIMAL_EXPONENT = "DecimalExponent"
BINARY_SI = "BinarySI"
DECIMAL_SI = "DecimalSI"

_SPLIT_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT_WRONG = f"quantities must match the regular expression '{_SPLIT_PATTERN}'"
ERR_NUMERIC = "unable to parse numeric part of quantity"
#: The longest quantity text parsed: far beyond any real amount (int64 has 19 digits).
MAX_LENGTH = 1000
ERR_SUFFIX = "unable to parse quantity's suffix"

# sign, leading zeros, digits, fraction, suffix: the same split the Kubernetes scanner makes.
_SPLIT = re.compile(r"([+-]?)(0*)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)")
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXPONENT = {exp: suffix for suffix, exp in _BINARY_SUFFIXES.items()}


class QuantityError(ValueError):
    """A string that Kubernetes would not accept as a quantity."""


def _fits_int64(value: int) -> bool:
    return _INT64_MIN <= value <= _INT64_MAX


def _wrap_int32(value: int) -> int:
    # Kubernetes converts the parsed exponent with int32(), which wraps around.
    return (value + 2**31) % 2**32 - 2**31


def _pow10(n: int) -> int:
    if n > _MAX_MATERIALIZED_EXPONENT:
        raise QuantityError("quantity exponent out of the supported range")
    power: int = 10**n
    return power


def _go_pow10(n: int) -> float:
    """Go's math.Pow10: a product of two table entries, which is not always correctly rounded."""
    if 0 <= n <= 308:
        return float(10 ** (n // 32 * 32)) * float(10 ** (n % 32))
    if -323 <= n < 0:
        high = 1 / 10 ** (-n // 32 * 32) if -n >= 32 else 1.0
        return high / float(10 ** (-n % 32))
    return float("inf") if n > 0 else 0.0


def _digits(value: int) -> int:
    return len(str(abs(value)))


def _compare(a: tuple[int, int], b: tuple[int, int]) -> int:
    """Compare coefficient*10**exponent pairs without building huge integers."""
    (ac, ae), (bc, be) = a, b
    sign_a, sign_b = (ac > 0) - (ac < 0), (bc > 0) - (bc < 0)
    if sign_a != sign_b or sign_a == 0:
        return (sign_a > sign_b) - (sign_a < sign_b)
    magnitude_a, magnitude_b = _digits(ac) + ae, _digits(bc) + be
    if magnitude_a != magnitude_b:
        bigger = 1 if magnitude_a > magnitude_b else -1
        return bigger * sign_a
    low = min(ae, be)
    x: int = ac * 10 ** (ae - low)
    y: int = bc * 10 ** (be - low)
    return (x > y) - (x < y)


class Quantity:
    """An exact Kubernetes quantity; ``Quantity.parse("40Gi")``.

    Instances are immutable, hashable and ordered by value (``1Gi == 1024Mi``).
    ``str()`` gives the text it was parsed from (what a ResourceSlice says), or a canonical
    form close to Kubernetes' for computed values.
    """

    __slots__ = ("_coefficient", "_exponent", "_format", "_is_int64", "_scale", "_text")

    def __init__(
        self, coefficient: int, exponent: int, fmt: str, *, is_int64: bool, scale: int, text: str = ""
    ) -> None:
        # value = coefficient * 10**exponent.  For the int64 form `scale` equals `exponent`;
        # for the decimal form it is the decimal's own scale (digits after the point), which
        # matters for asApproximateFloat().
        self._coefficient = coefficient
        self._exponent = exponent
        self._format = fmt
        self._is_int64 = is_int64
        self._scale = scale
        self._text = text

    @classmethod
    def _int64(cls, value: int, scale: int, fmt: str, text: str = "") -> Quantity:
        return cls(value, scale, fmt, is_int64=True, scale=scale, text=text)

    @classmethod
    def _decimal(cls, unscaled: int, scale: int, fmt: str, text: str = "") -> Quantity:
        return cls(unscaled, -scale, fmt, is_int64=False, scale=scale, text=text)

    @classmethod
    def from_int(cls, value: int) -> Quantity:
        """The quantity CEL's ``q.add(1)`` uses for an int operand (Kubernetes' NewQuantity)."""
        return cls._int64(value, 0, DECIMAL_EXPONENT)

    @classmethod
    def binary(cls, value: int) -> Quantity:
        """An integer in binary SI units where they fit, as a byte count is written (1048576: 1Mi)."""
        return cls._int64(value, 0, BINARY_SI)

    @staticmethod
    def parse(text: str) -> Quantity:
        """Parse like resource.ParseQuantity; raises QuantityError with its message."""
        return _parse(text)

    @classmethod
    def _parse_uncached(cls, text: str) -> Quantity:
        if not text:
            raise QuantityError(ERR_FORMAT_WRONG)
        if len(text) > MAX_LENGTH:
            # Go parses any length; Python refuses to convert more than 4,300 digits and
            # grows quadratically before that, so a bound keeps every parse cheap.
            raise QuantityError(f"quantity is {len(text)} characters long, more than {MAX_LENGTH}")
        if text == "0":
            return cls._int64(0, 0, DECIMAL_SI, text)
        match = _SPLIT.fullmatch(text)
        if match is None:
            raise QuantityError(ERR_FORMAT_WRONG)
        sign, zeros, digits, fraction, suffix = match.groups()
        fraction = fraction or ""
        number = digits or "0"
        negative = sign == "-"
        base, exponent, fmt = _interpret_suffix(suffix)

        if fmt == BINARY_SI:
            mantissa, scale = 1 << exponent, 0
            # Kubernetes' estimate of whether value * 2**exponent still fits an int64.
            precision = 15 - len(number) - exponent * 3 // 10 - 1 if not fraction else -1
        else:
            mantissa, scale = 1, exponent
            precision = 18 - len(number) - len(fraction)
        if precision >= 0:
            scale -= len(fraction)
            if scale >= -_NANO_DIGITS:
                value = int(number + fraction) * mantissa
                if _fits_int64(value):
                    return cls._int64(-value if negative else value, scale, fmt, text)

        if not (zeros or digits or fraction):
            raise QuantityError(ERR_NUMERIC)
        coefficient, coef_exponent = int(number + fraction), -len(fraction)
        if base == 10:
            coef_exponent += exponent
        else:
            coefficient <<= exponent
        coefficient, decimal_scale = _round_up_to_nano(coefficient, coef_exponent)
        if fmt == BINARY_SI and _compare((coefficient, -decimal_scale), (_INT64_MAX, 0)) > 0:
            coefficient, decimal_scale = _INT64_MAX, 0
        if fmt == BINARY_SI and coefficient > 0 and decimal_scale > 0 and coefficient < 10**decimal_scale:
            fmt = DECIMAL_SI
        return cls._decimal(-coefficient if negative else coefficient, decimal_scale, fmt, text)

    # -- comparisons -------------------------------------------------------------------

    def _pair(self) -> tuple[int, int]:
        return self._coefficient, self._exponent

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1, like Quantity.Cmp and CEL's ``compareTo``."""
        return _compare(self._pair(), other._pair())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.compare(other) == 0

    def __lt__(self, other: Quantity) -> bool:
        return self.compare(other) < 0

    def __le__(self, other: Quantity) -> bool:
        return self.compare(other) <= 0

    def __gt__(self, other: Quantity) -> bool:
        return self.compare(other) > 0

    def __ge__(self, other: Quantity) -> bool:
        return self.compare(other) >= 0

    def __hash__(self) -> int:
        coefficient, exponent = self._pair()
        while coefficient and coefficient % 10 == 0:
            coefficient, exponent = coefficient // 10, exponent + 1
        return hash((coefficient, exponent if coefficient else 0))

    # -- accessors ---------------------------------------------------------------------

    def exact(self) -> Fraction:
        """The exact value."""
        if self._exponent >= 0:
            return Fraction(self._coefficient * _pow10(self._exponent))
        return Fraction(self._coefficient, _pow10(-self._exponent))

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self._coefficient > 0) - (self._coefficient < 0)

    def as_int64(self) -> int | None:
        """The value as an int64 when Kubernetes' AsInt64 succeeds, else None.

        Only the int64 form with a non-negative scale converts: ``1000m`` and ``1.5Ki``
        do not, although their values are integers.
        """
        if not self._is_int64 or self._exponent < 0:
            return None
        if self._coefficient == 0 or self._exponent == 0:
            return self._coefficient
        if self._exponent > 18:
            return None
        value: int = self._coefficient * 10**self._exponent
        return value if _fits_int64(value) else None

    def as_approximate_float(self) -> float:
        """The value as a float, computed the way AsApproximateFloat64 does."""
        if self._is_int64:
            base, exponent = float(self._coefficient), self._scale
        else:
            # The decimal form stores the unscaled integer itself: exponent == -scale.
            base, exponent = _int_to_float(self._coefficient), -self._scale
        if exponent == 0:
            return base
        return base * _go_pow10(exponent)

    # -- arithmetic --------------------------------------------------------------------

    def add(self, other: Quantity) -> Quantity:
        """self + other; the result keeps the int64 form when Kubernetes' would."""
        if self._is_int64 and other._is_int64:
            fmt = other._format if self._coefficient == 0 else self._format
            result = _add_int64(self._pair(), other._pair())
            if result is not None:
                return Quantity._int64(result[0], result[1], fmt)
        else:
            fmt = other._format if self.sign() == 0 else self._format
        return self._decimal_sum(other, 1, fmt)

    def sub(self, other: Quantity) -> Quantity:
        """self - other; the result keeps the int64 form when Kubernetes' would."""
        fmt = other._format if self.sign() == 0 else self._format
        if self._is_int64 and other._is_int64:
            negated = other._coefficient if other._coefficient == _INT64_MIN else -other._coefficient
            result = _add_int64(self._pair(), (negated, other._exponent))
            if result is not None:
                return Quantity._int64(result[0], result[1], fmt)
        return self._decimal_sum(other, -1, fmt)

    def _decimal_sum(self, other: Quantity, sign: int, fmt: str) -> Quantity:
        # inf.Dec addition: the result has the larger of the two scales.
        scale = max(self._decimal_scale(), other._decimal_scale())
        total = self._unscaled(scale) + sign * other._unscaled(scale)
        return Quantity._decimal(total, scale, fmt)

    def _decimal_scale(self) -> int:
        return -self._exponent if self._is_int64 else self._scale

    def _unscaled(self, scale: int) -> int:
        return self._coefficient * _pow10(self._exponent + scale)

    # -- text --------------------------------------------------------------------------

    def __str__(self) -> str:
        return self._text or self._canonical()

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def _canonical(self) -> str:
        coefficient, exponent = self._coefficient, self._exponent
        if coefficient == 0:
            return "0"
        fmt = self._format
        if fmt == BINARY_SI and exponent > 30:
            fmt = DECIMAL_SI
        if fmt == BINARY_SI:
            value = self.exact()
            if abs(value) < 1024 or value.denominator != 1:
                fmt = DECIMAL_SI
            else:
                number, power = int(value), 0
                while power < 6 and number % 1024 == 0:
                    number, power = number // 1024, power + 1
                return f"{number}{_BINARY_BY_EXPONENT.get(power * 10, '')}"
        while coefficient % 10 == 0:
            coefficient, exponent = coefficient // 10, exponent + 1
        while exponent % 3:
            coefficient, exponent = coefficient * 10, exponent - 1
        if fmt == DECIMAL_SI and exponent in _DECIMAL_BY_EXPONENT:
            return f"{coefficient}{_DECIMAL_BY_EXPONENT[exponent]}"
        return f"{coefficient}e{exponent}" if exponent else str(coefficient)


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Quantity:
    # Selectors parse the same few literals for every device; quantities are immutable.
    return Quantity._parse_uncached(text)


def _interpret_suffix(suffix: str) -> tuple[int, int, str]:
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        rest = suffix[1:]
        # strconv.ParseInt: an optional sign and at least one digit, within int64.
        if re.fullmatch(r"[+-]?[0-9]+", rest) and _fits_int64(int(rest)):
            return 10, _wrap_int32(int(rest)), DECIMAL_EXPONENT
    raise QuantityError(ERR_SUFFIX)


def _round_up_to_nano(coefficient: int, exponent: int) -> tuple[int, int]:
    """Round |coefficient * 10**exponent| up to nano precision: (unscaled, scale=9).

    Zero keeps its scale untouched like inf.Dec does; the sign is restored by the caller.
    """
    magnitude = abs(coefficient)
    if magnitude == 0:
        return 0, max(0, -exponent)
    shift = exponent + _NANO_DIGITS
    if shift >= 0:
        return magnitude * _pow10(shift), _NANO_DIGITS
    if _digits(magnitude) <= -shift:
        return 1, _NANO_DIGITS  # smaller than one nano: rounds up to exactly 1n
    divisor = 10**-shift
    return -(-magnitude // divisor), _NANO_DIGITS


def _add_int64(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """int64Amount.Add: None where Kubernetes would overflow and switch to decimals."""
    (av, ascale), (bv, bscale) = a, b
    if bv == 0:
        return av, ascale
    if av == 0:
        return bv, bscale
    if ascale == bscale:
        total, scale = av + bv, ascale
    elif ascale > bscale:
        if ascale - bscale > 18:
            return None
        total, scale = av * 10 ** (ascale - bscale), bscale
        if not _fits_int64(total):
            return None
        total += bv
    else:
        if bscale - ascale > 18:
            return None
        shifted = bv * 10 ** (bscale - ascale)
        if not _fits_int64(shifted):
            return None
        total, scale = av + shifted, ascale
    return (total, scale) if _fits_int64(total) else None


def _int_to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")

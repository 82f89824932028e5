"""Quantity parsing and arithmetic; expected values come from k8s.io/apimachinery v0.34."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra.model.quantity import ERR_FORMAT_WRONG, ERR_NUMERIC, ERR_SUFFIX, Quantity, QuantityError


@pytest.mark.parametrize(
    ("text", "value", "as_int64", "approximate"),
    [
        ("0", 0, 0, 0.0),
        ("1", 1, 1, 1.0),
        ("+5", 5, 5, 5.0),
        ("-000", 0, 0, 0.0),
        (".", 0, 0, 0.0),
        ("-", 0, 0, 0.0),
        ("1.", 1, 1, 1.0),
        ("00.00", 0, None, 0.0),  # stored with scale -2: not an int64 for Kubernetes
        ("1Ki", 1024, 1024, 1024.0),
        ("1.Ki", 1024, 1024, 1024.0),
        ("1.5Ki", 1536, None, 1536.0),  # a fraction with a binary suffix is stored as a decimal
        (".5Ki", 512, None, 512.0),
        ("100Mi", 104857600, 104857600, 104857600.0),
        ("81559Mi", 85520809984, 85520809984, 85520809984.0),
        ("40Gi", 42949672960, 42949672960, 42949672960.0),
        ("1.5Gi", 1610612736, None, 1610612736.0),
        ("7Ei", 7 * 2**60, None, 8.070450532247929e18),
        ("8Ei", 2**63 - 1, None, 9.223372036854776e18),  # binary quantities are capped at MaxInt64
        ("-8Ei", -(2**63 - 1), None, -9.223372036854776e18),
        ("1k", 1000, 1000, 1000.0),
        ("1E", 10**18, 10**18, 1e18),
        ("1e3", 1000, 1000, 1000.0),
        ("1E3", 1000, 1000, 1000.0),
        ("1e+3", 1000, 1000, 1000.0),
        ("1e-3", Fraction(1, 1000), None, 0.001),
        ("1500m", Fraction(3, 2), None, 1.5),
        ("1000m", 1, None, 1.0),  # scale -3: asInteger() fails in Kubernetes
        ("0.1", Fraction(1, 10), None, 0.1),
        ("-1.5", Fraction(-3, 2), None, -1.5),
        ("1n", Fraction(1, 10**9), None, 1e-09),
        ("0.1n", Fraction(1, 10**9), None, 1e-09),  # rounded up to nano precision
        ("1.5n", Fraction(2, 10**9), None, 2e-09),
        ("-1.5n", Fraction(-2, 10**9), None, -2e-09),
        ("1.1e-10", Fraction(1, 10**9), None, 1e-09),
        ("-0.0000000001", Fraction(-1, 10**9), None, -1e-09),
        ("123456789012345678", 123456789012345678, 123456789012345678, 1.2345678901234568e17),
        ("1234567890123456789", 1234567890123456789, None, 1.234567890123457e18),
        ("9223372036854775808", 2**63, None, 9.223372036854776e18),
        ("12e17", 12 * 10**17, 12 * 10**17, 1.2e18),
        ("1e19", 10**19, None, 1e19),
        ("1.000000000001", Fraction(1000000001, 10**9), None, 1.000000001),
        ("1e100", 10**100, None, 1e100),
        ("1e9223372036854775807", Fraction(1, 10), None, 0.1),  # Kubernetes truncates the exponent to int32
    ],
)
def test_parse(text: str, value: int | Fraction, as_int64: int | None, approximate: float) -> None:
    quantity = Quantity.parse(text)
    assert quantity.exact() == value
    assert quantity.as_int64() == as_int64
    assert quantity.as_approximate_float() == approximate
    assert str(quantity) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ERR_FORMAT_WRONG),
        ("1 ", ERR_FORMAT_WRONG),
        (" 1", ERR_FORMAT_WRONG),
        ("1.2.3", ERR_FORMAT_WRONG),
        ("1KiB", ERR_FORMAT_WRONG),
        ("0x10", ERR_FORMAT_WRONG),
        ("1e1e", ERR_FORMAT_WRONG),
        ("5i", ERR_SUFFIX),
        ("1ki", ERR_SUFFIX),
        ("1mi", ERR_SUFFIX),
        ("1Ki5", ERR_SUFFIX),
        ("1k5", ERR_SUFFIX),
        ("1e", ERR_SUFFIX),
        ("1EE", ERR_SUFFIX),
        ("100e+", ERR_SUFFIX),
        ("1e9223372036854775808", ERR_SUFFIX),
        (".e-10", ERR_NUMERIC),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as raised:
        Quantity.parse(text)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("81559Mi", "80Gi", -1),  # an H100's reported memory is just below 80Gi
        ("1Gi", "1024Mi", 0),
        ("1", "1000m", 0),
        ("1E3", "1k", 0),
        ("100m", "1", -1),
        ("1.5Gi", "1536Mi", 0),
        ("-1", "0", -1),
        ("16Ei", "8Ei", 0),
        ("1e100", "1e99", 1),
        ("1e2147483647", "1", 1),
    ],
)
def test_compare(left: str, right: str, expected: int) -> None:
    a, b = Quantity.parse(left), Quantity.parse(right)
    assert a.compare(b) == expected
    assert b.compare(a) == -expected
    assert (a == b) is (expected == 0)
    assert (a < b) is (expected < 0)
    if expected == 0:
        assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("left", "operation", "right", "value", "as_int64", "approximate"),
    [
        ("1", "add", 1, 2, 2, 2.0),
        ("1Mi", "sub", "1Ki", 1047552, 1047552, 1047552.0),
        ("1", "sub", 5, -4, -4, -4.0),
        ("1k", "add", "1m", Fraction(1000001, 1000), None, 1000.001),
        ("1Ki", "add", "1.5", Fraction(2051, 2), None, 1025.5),
        # int64 overflow switches to the decimal representation, as in Kubernetes.
        ("9223372036854775807", "add", 1, 2**63, None, 9.223372036854776e18),
        (
            "922337203685477580",
            "add",
            "922337203685477580",
            1844674407370955160,
            1844674407370955160,
            1.8446744073709552e18,
        ),
    ],
)
def test_arithmetic(
    left: str,
    operation: str,
    right: str | int,
    value: int | Fraction,
    as_int64: int | None,
    approximate: float,
) -> None:
    other = Quantity.from_int(right) if isinstance(right, int) else Quantity.parse(right)
    result = Quantity.parse(left).add(other) if operation == "add" else Quantity.parse(left).sub(other)
    assert result.exact() == value
    assert result.as_int64() == as_int64
    assert result.as_approximate_float() == approximate


def test_decimal_detour_stays_decimal() -> None:
    # 1 + 0.5 - 0.5 is 1, but Kubernetes keeps the decimal form, so it is no int64.
    half = Quantity.parse("0.5")
    result = Quantity.parse("1").add(half).sub(half)
    assert result == Quantity.parse("1")
    assert result.as_int64() is None


@pytest.mark.parametrize(
    ("left", "right", "text"),
    [
        ("1Gi", "512Mi", "1536Mi"),
        ("1k", "500", "1500"),
        ("1", "500m", "1500m"),
        ("1Ki", "-1Ki", "0"),
        ("1e3", "1e3", "2e3"),
    ],
)
def test_computed_text(left: str, right: str, text: str) -> None:
    assert str(Quantity.parse(left).add(Quantity.parse(right))) == text


def test_sign_and_huge_exponents() -> None:
    assert Quantity.parse("-1Ki").sign() == -1
    assert Quantity.parse("0Ki").sign() == 0
    with pytest.raises(QuantityError, match="out of the supported range"):
        Quantity.parse("1e2147483647").add(Quantity.parse("1"))

from fractions import Fraction

import pytest

from hooks.batchresource.quantity import QuantityError, parse_quantity, quantity_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("500", 500),
        ("+7", 7),
        ("-3", -3),
        # milli and the other small decimal SI suffixes
        ("500m", Fraction(1, 2)),
        ("1500m", Fraction(3, 2)),
        ("5u", Fraction(5, 10**6)),
        ("5n", Fraction(5, 10**9)),
        # decimal SI
        ("1k", 1000),
        ("2M", 2 * 10**6),
        ("3G", 3 * 10**9),
        ("4T", 4 * 10**12),
        ("5P", 5 * 10**15),
        ("6E", 6 * 10**18),
        # binary
        ("1Ki", 1024),
        ("128Mi", 128 * 2**20),
        ("1Gi", 2**30),
        ("2Ti", 2 * 2**40),
        ("3Pi", 3 * 2**50),
        ("1Ei", 2**60),
        # exponents
        ("1e9", 10**9),
        ("1E9", 10**9),
        ("15e-1", Fraction(3, 2)),
        ("2e+3", 2000),
        # fractions
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("1.5Gi", 3 * 2**29),
        ("0.5k", 500),
        (" 42 ", 42),
    ],
)
def test_parse(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", " ", "abc", "1.2.3", "1KiB", "1ki", "1K", "Mi", "1 Mi", "--1", "1e", "1e1.5", "0x10", "1,000", "∞", "1Mi2", "1e99999"],
)
def test_invalid(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["9" * 5000, "0." + "0" * 5000 + "1", "1" * 101 + "Mi"])
def test_too_many_digits(text: str) -> None:
    # A ValueError from Python's int conversion limit would escape as a hook failure.
    with pytest.raises(QuantityError, match="no resource quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e" + "9" * 5000, "1e1234567890"])
def test_an_exponent_of_many_digits_is_no_quantity(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e999999999", "1e-31"])
def test_an_exponent_out_of_range(text: str) -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity(text)


def test_a_long_but_plausible_number_is_read() -> None:
    assert parse_quantity("0." + "0" * 90 + "5") == Fraction(5, 10**91)


@pytest.mark.parametrize("value", [500, 1.5, None, ["1"], {"a": 1}])
def test_not_a_string(value: object) -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        parse_quantity(value)


@pytest.mark.parametrize(("text", "value"), [("0.5", 1), ("500m", 1), ("1001m", 2), ("1.2Ki", 1229), ("-0.5", 0), ("1e9", 10**9), ("7", 7)])
def test_value_rounds_up_like_kubernetes(text: str, value: int) -> None:
    assert quantity_value(text) == value

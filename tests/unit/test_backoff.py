import pytest

from policies.backoff import backoff_ms


def test_doubles_from_the_initial_wait_up_to_the_cap() -> None:
    waits = [backoff_ms(n, initial_ms=500, max_ms=10_000) for n in range(1, 8)]
    assert waits == [500, 1000, 2000, 4000, 8000, 10_000, 10_000]


def test_multiplier_and_no_cap() -> None:
    assert [backoff_ms(n, initial_ms=1000, multiplier=5) for n in (1, 2, 3)] == [1000, 5000, 25000]


def test_a_huge_attempt_stays_at_the_cap() -> None:
    assert backoff_ms(10**6, initial_ms=1, max_ms=30_000) == 30_000


def test_jitter_spreads_both_ways_and_never_passes_the_cap() -> None:
    assert backoff_ms(1, initial_ms=1000, jitter=0.15, rand=0.0) == 850
    assert backoff_ms(1, initial_ms=1000, jitter=0.15, rand=0.999999) == 1150
    assert backoff_ms(9, initial_ms=1000, max_ms=2000, jitter=0.5, rand=0.99) == 2000


@pytest.mark.parametrize("kwargs", [{"initial_ms": -1}, {"initial_ms": 1, "multiplier": 0.5},
                                    {"initial_ms": 1, "jitter": 2.0}])
def test_bad_arguments_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        backoff_ms(1, **kwargs)


def test_without_a_cap_a_huge_attempt_is_still_a_number() -> None:
    assert backoff_ms(10**5, initial_ms=1000, multiplier=5) == 2**53

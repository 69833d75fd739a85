"""The estimate book prices a job from earlier estimates, with numbers written out here."""

from __future__ import annotations

import pytest

from attrlab.attribution.errors import TooSlowError
from attrlab.attribution.request.gate import clear_slot
from attrlab.attribution.request.pricing import EstimateBook, Price, slot_seconds


def test_a_part_is_priced_at_the_highest_rate_seen_plus_the_largest_recent_overhead():
    book = EstimateBook(recent=2)
    book.record([("rise", 10, 2.0), ("rise", 40, 4.0)], beyond=1.0)  # 0.2 s and 0.1 s per unit
    assert book.price([("rise", 20)]) == Price(pytest.approx(20 * 0.2 + 1.0), True)
    book.record([], beyond=3.0)
    book.record([], beyond=0.5)  # only the last two runs count: 3.0 and 0.5
    assert book.price([("rise", 20)]).seconds == pytest.approx(4.0 + 3.0)
    book.record([], beyond=0.25)  # 3.0 has left the window
    assert book.price([("rise", 20)]).seconds == pytest.approx(4.0 + 0.5)


def test_parts_add_and_a_size_beyond_those_seen_is_not_sure():
    book = EstimateBook(recent=5)
    book.record([("ig", 10, 1.0), ("shap", 5, 5.0)], beyond=0.0)
    assert book.price([("ig", 10), ("shap", 5)]) == Price(pytest.approx(6.0), True)
    assert book.price([("ig", 30), ("shap", 5)]) == Price(pytest.approx(8.0), False)


def test_an_unknown_or_unanswered_kind_has_no_price_until_a_run_answers():
    book = EstimateBook(recent=5)
    assert book.price([]) == Price(None, False)
    assert book.price([("rise", 10)]) == Price(None, False)
    book.record([("rise", 10, 2.0)], beyond=0.0)
    book.record_unanswered(["rise"])
    assert book.unanswered(["ig", "rise"]) and not book.unanswered(["ig"])
    assert book.price([("rise", 10)]) == Price(None, False)
    book.record([("rise", 10, 3.0)], beyond=0.0)
    assert not book.unanswered(["rise"])
    assert book.price([("rise", 10)]) == Price(pytest.approx(3.0), True)


def test_a_slot_longer_than_the_space_allows_is_refused_only_when_its_price_is_sure():
    params = {"rise": {"n_masks": 4000}}
    assert slot_seconds(20.0) == 50  # twice the estimate and 10 s
    clear_slot(None, True, 50, params)  # not priced yet: the first run learns its price
    clear_slot(20.0, True, 50, params)  # exactly the longest slot
    clear_slot(30.0, False, 50, params)  # priced from smaller inputs only: a guess, runs
    with pytest.raises(TooSlowError, match=r"a GPU slot of about 71 s; .* at most 50 s") as err:
        clear_slot(30.5, True, 50, params)
    assert "rise: lower n_masks" in str(err.value)

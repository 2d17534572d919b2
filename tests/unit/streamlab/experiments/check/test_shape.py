"""shape.py's tool-call rules, on deltas as servers send them."""

from __future__ import annotations

from typing import Any

from streamlab.experiments.check.shape import tool_call_shape


def call(index: int | None, *, id_: str | None = None, name: str | None = None,
         args: str = "") -> dict[str, Any]:
    delta: dict[str, Any] = {"function": {"arguments": args}}
    if index is not None:
        delta["index"] = index
    if id_:
        delta["id"], delta["type"] = id_, "function"
    if name:
        delta["function"]["name"] = name
    return delta


def test_deltas_as_the_sdks_accumulate_them_break_no_rule() -> None:
    deltas = [call(0, id_="c0", name="get_weather"), call(1, id_="c1", name="get_weather"),
              call(0, args='{"city": '), call(1, args='{"city": "Oslo"}'), call(0, args='"Paris"}')]
    shape = tool_call_shape(deltas)
    assert shape["calls"] == 2
    assert shape["first_problem"] is None
    assert (shape["deltas_without_index"], shape["first_without_id_or_name"],
            shape["repeated_id_or_name"], shape["arguments_not_json"]) == (0, 0, 0, 0)


def test_each_rule_names_the_delta_that_breaks_it() -> None:
    assert tool_call_shape([call(None, id_="c", name="f", args="{}")])["deltas_without_index"] == 1
    assert tool_call_shape([call(0, args="{}")])["first_without_id_or_name"] == 1
    repeated = tool_call_shape([call(0, id_="c", name="f", args="{"),
                                call(0, id_="c", name="f", args="}")])
    assert repeated["repeated_id_or_name"] == 1
    assert repeated["first_problem"] == "call 0's delta 1 repeats its id or name"
    assert tool_call_shape([call(0, id_="c", name="f", args='{"a": ')])["arguments_not_json"] == 1

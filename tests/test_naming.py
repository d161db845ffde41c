"""Slug rules and generated queue names (Python side), with hand-picked cases from the spec."""

import pytest

from pgflow_cli import naming
from pgflow_cli.errors import ExitCode, UsageError


@pytest.mark.parametrize(
    "slug, reasons",
    [
        ("greetUser", ()),
        ("process_order", ()),
        ("a", ()),
        ("step1", ()),
        ("", ("empty",)),
        (None, ("empty",)),
        ("_private", ("leading_underscore",)),
        ("trailing_", ("trailing_underscore",)),
        ("a__b", ("double_underscore",)),
        ("__", ("leading_underscore", "trailing_underscore", "double_underscore")),
        ("_a__b_", ("leading_underscore", "trailing_underscore", "double_underscore")),
        ("1abc", ("leading_digit",)),
        ("run", ("reserved_word",)),
        ("Run", ()),
        ("has space", ("invalid_character",)),
        ("kebab-case", ("invalid_character",)),
        ("héllo", ("invalid_character",)),
        ("x" * 128, ()),
        ("x" * 129, ("too_long",)),
        ("9_" + "x" * 127 + "-", ("too_long", "invalid_character", "leading_digit", "trailing_underscore")[:0] or
         ("too_long", "invalid_character", "leading_digit")),
        ("tab\tname", ("invalid_character",)),
    ],
)
def test_slug_violations_report_every_reason_in_fixed_order(slug, reasons):
    assert naming.slug_violations(slug) == reasons


def test_reason_codes_have_text_and_fixed_order():
    assert set(naming.SLUG_REASONS) <= set(naming.REASON_TEXT)
    found = naming.slug_violations("_1 a__" + "x" * 130 + "_")
    assert list(found) == sorted(found, key=naming.SLUG_REASONS.index)


def test_default_queue_is_lowercase_slug_within_47():
    assert naming.default_queue_name("MyFlow") == naming.QueueName("myflow", None, "default")
    assert naming.default_queue_name("a" * 47).name == "a" * 47
    assert naming.default_queue_name("a" * 48).reason == "queue_name_too_long"
    assert naming.default_queue_name("bad__slug").reason == "invalid_flow_slug"


def test_step_queue_readable_then_index_then_reject():
    assert naming.step_queue_name("Orders", "chargeCard", 3) == naming.QueueName("orders__chargecard", None, "readable")
    flow = "f" * 40
    # readable: 40 + 2 + 6 = 48 > 47 -> index fallback 40 + 2 + 1 = 43
    assert naming.step_queue_name(flow, "abcdef", 7) == naming.QueueName(f"{flow}__7", None, "index")
    # exactly 47 stays readable
    assert naming.step_queue_name("f" * 40, "abcde", 0).kind == "readable"
    # fallback needs 45 + 2 + 2 = 49 > 47 for index 10
    assert naming.step_queue_name("f" * 45, "step", 10) == naming.QueueName(None, "queue_name_too_long")
    assert naming.step_queue_name("f" * 44, "step", 9).name == "f" * 44 + "__9"
    assert naming.step_queue_name("ok", "_bad", 0).reason == "invalid_step_slug"
    assert naming.step_queue_name("ok", "good", -1).reason == "invalid_step_index"


def test_route_map_rejects_whole_flow_with_every_problem():
    with pytest.raises(UsageError) as info:
        naming.step_queue_routes("f" * 46, ["ok", "Ok", "bad_", "x" * 30] + [f"s{i}" for i in range(20)])
    err = info.value
    assert err.exit_code == ExitCode.USAGE
    text = "\n".join(err.detail)
    assert "only by case" in text and "[trailing_underscore]" in text and "[queue_name_too_long]" in text


def test_route_map_in_definition_order():
    routes = naming.step_queue_routes("Shop", ["fetch", "charge"])
    assert list(routes.items()) == [("fetch", "shop__fetch"), ("charge", "shop__charge")]


def test_normalized_slug_only_lowers_ascii():
    assert naming.normalized_slug("ÀbC") == "Àbc"
    assert naming.normalized_slug("İI") == "İi"


def test_validate_slug_message_names_every_rule():
    with pytest.raises(UsageError) as info:
        naming.validate_slug("_x_", what="flow slug")
    assert "starts with _" in info.value.message and "ends with _" in info.value.message

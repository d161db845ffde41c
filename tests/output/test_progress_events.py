"""Progress is typed events: every kind the engine or ``migrate apply`` emits has a JSON form and a
line (or a deliberate silence) in the command line's renderer."""

from __future__ import annotations

import dataclasses
import json
import typing

from pgflow_cli.cli.migrate import describe_event
from pgflow_cli.installer import events

SAMPLES: dict[type, object] = {str: "x", int: 2, float: 0.5, bool: True}


def _sample(kind: type[events.Event]) -> events.Event:
    """An instance of ``kind`` with a plain value in every field (tuples and dicts as the fields say)."""
    hints = typing.get_type_hints(kind)
    values = {}
    for f in dataclasses.fields(kind):
        hint = hints[f.name]
        origin = typing.get_origin(hint)
        if origin is tuple:
            values[f.name] = ({"pid": 1, "application_name": "w", "user_name": "u", "state": "idle", "seconds": 3},) \
                if typing.get_args(hint)[0] is not str else ("pid 1 (w, user u)",)
        elif hint == (dict[str, typing.Any] | None):
            values[f.name] = {"object": "pgflow.flows", "mode": "AccessExclusiveLock"}
        else:
            values[f.name] = SAMPLES[hint]
    return kind(**values)


def test_every_kind_has_a_json_form_and_a_rendering():
    kinds = [kind.kind for kind in events.EVENTS]
    declared = {c for c in events.Event.__subclasses__() if c.__module__ == events.__name__}
    assert len(set(kinds)) == len(kinds) and set(events.EVENTS) == declared
    for kind in events.EVENTS:
        event = _sample(kind)
        document = json.loads(json.dumps(event.to_dict()))
        assert document["event"] == kind.kind and set(document) == {"event", *(f.name for f in dataclasses.fields(kind))}
        lines = describe_event(event)
        assert all(isinstance(text, str) and text for text, _style in lines)
    assert describe_event(_sample(events.StepStarted))[0][0] == "applying x (attempt 2)..."
    assert describe_event(_sample(events.StepStarted), dry_run=True)[0][0] == "dry run of x (attempt 2)..."
    assert describe_event(_sample(events.PhaseDone)) == [] and describe_event(_sample(events.LateLocksGivenBack)) == []


def test_an_unknown_event_is_an_error_not_a_silence():
    @dataclasses.dataclass(frozen=True)
    class Unheard(events.Event):
        kind: typing.ClassVar[str] = "unheard"

    try:
        describe_event(Unheard())
    except TypeError as exc:
        assert "Unheard" in str(exc)
    else:
        raise AssertionError("describe_event printed nothing for an event it does not know")

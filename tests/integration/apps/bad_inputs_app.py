"""An app whose handlers misbehave on purpose, for tests/integration/test_bad_inputs.py.

Imported by reference (``bad_inputs_app:app``) by a processor started with this folder on
``PYTHONPATH``; not a test module.
"""

from __future__ import annotations

import time
from typing import Any

from cqrs.app import App
from cqrs.domain import Aggregate, CommandHandler, Event, command, event
from projections import Projection

__all__ = ["Blow", "Crash", "Foreign", "NotEvents", "Note", "Notes", "SendForeign", "Sleep", "Tick",
           "Ticked", "Write", "Written", "app", "make_app"]


@command(name="badin.Write")
class Write:
    text: str


@command(name="badin.Sleep")
class Sleep:
    seconds: float  # a handler that waits on a slow (or hung) service this long


@command(name="badin.NotEvents")
class NotEvents:
    what: str  # "string", "dict" or "none-list"


@command(name="badin.SendForeign")
class SendForeign:
    note: str


@command(name="badin.Blow")
class Blow:
    """A small command whose event is ``size`` bytes of text."""

    size: int


@command(name="badin.Tick")
class Tick:
    """A small command with ``count`` small events."""

    count: int


@command(name="badin.Crash")
class Crash:
    """A command (of any size) whose handler raises."""

    text: str


@event(name="badin.Written")
class Written:
    text: str


@event(name="badin.Ticked")
class Ticked:
    index: int


@event(name="badin.Foreign")
class Foreign:
    """An event no aggregate applies and the app does not register."""

    note: str


class Note(Aggregate, name="badin.Note"):
    size: int = 0
    ticks: int = 0

    def apply_written(self, e: Written) -> None:
        self.size += len(e.text)

    def apply_ticked(self, e: Ticked) -> None:
        self.ticks += 1


class NoteHandler(CommandHandler[Note]):
    def write(self, note: Note, cmd: Write) -> list[Event]:
        return [Written(cmd.text)]

    def not_events(self, note: Note, cmd: NotEvents) -> list[Event]:
        returned: Any = {"string": "not a list of events", "dict": {"text": "x"},
                         "list": ["a string in a list"]}[cmd.what]
        return returned  # type: ignore[no-any-return]

    def send_foreign(self, note: Note, cmd: SendForeign) -> list[Event]:
        return [Foreign(cmd.note)]

    def blow(self, note: Note, cmd: Blow) -> list[Event]:
        return [Written("b" * cmd.size)]

    def tick(self, note: Note, cmd: Tick) -> list[Event]:
        return [Ticked(i) for i in range(cmd.count)]

    def sleep(self, note: Note, cmd: Sleep) -> list[Event]:
        time.sleep(cmd.seconds)
        return [Written(f"slept {cmd.seconds} s")]

    def crash(self, note: Note, cmd: Crash) -> list[Event]:
        raise RuntimeError(f"crashed on a {len(cmd.text):,}-character command")


class Notes(Projection):
    """A read model of every note (run by ``cqrs run app``): an event projected without its
    command answered would show here."""

    name = "notes"
    aggregate = Note
    key = "note_id"
    columns = {"size": int, "ticks": int}
    defaults = {"size": 0, "ticks": 0}

    def on_written(self, view: dict, event: Written) -> None:
        view["size"] += len(event.text)

    def on_ticked(self, view: dict, event: Ticked) -> None:
        view["ticks"] += 1


def make_app() -> App:
    return App("badin", aggregates=[Note], handlers=[NoteHandler], projections=[Notes])


app = make_app()

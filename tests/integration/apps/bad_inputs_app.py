"""An app whose handlers misbehave on purpose, for tests/integration/test_bad_inputs.py.

Imported by reference (``bad_inputs_app:app``) by a processor started with this folder on
``PYTHONPATH``; not a test module.
"""

from __future__ import annotations

from typing import Any

from cqrs.app import App
from cqrs.domain import Aggregate, CommandHandler, Event, command, event

__all__ = ["Foreign", "NotEvents", "Note", "SendForeign", "Write", "Written", "app", "make_app"]


@command(name="badin.Write")
class Write:
    text: str


@command(name="badin.NotEvents")
class NotEvents:
    what: str  # "string", "dict" or "none-list"


@command(name="badin.SendForeign")
class SendForeign:
    note: str


@event(name="badin.Written")
class Written:
    text: str


@event(name="badin.Foreign")
class Foreign:
    """An event no aggregate applies and the app does not register."""

    note: str


class Note(Aggregate, name="badin.Note"):
    size: int = 0

    def apply_written(self, e: Written) -> None:
        self.size += len(e.text)


class NoteHandler(CommandHandler[Note]):
    def write(self, note: Note, cmd: Write) -> list[Event]:
        return [Written(cmd.text)]

    def not_events(self, note: Note, cmd: NotEvents) -> list[Event]:
        returned: Any = {"string": "not a list of events", "dict": {"text": "x"},
                         "list": ["a string in a list"]}[cmd.what]
        return returned  # type: ignore[no-any-return]

    def send_foreign(self, note: Note, cmd: SendForeign) -> list[Event]:
        return [Foreign(cmd.note)]


def make_app() -> App:
    return App("badin", aggregates=[Note], handlers=[NoteHandler])


app = make_app()

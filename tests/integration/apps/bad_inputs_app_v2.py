"""``bad_inputs_app`` after an incompatible change: ``badin.Write.text`` became an int (no
default, no upcaster); its ``notes`` projection is the same. For
tests/integration/test_bad_inputs.py; not a test module."""

from __future__ import annotations

from cqrs.app import App
from cqrs.domain import Aggregate, CommandHandler, Event, command, event
from projections import Projection

__all__ = ["app"]


@command(name="badin.Write")
class Write:
    text: int


@event(name="badin.Written")
class Written:
    text: str


class Note(Aggregate, name="badin.Note"):
    def apply_written(self, e: Written) -> None:
        pass


class NoteHandler(CommandHandler[Note]):
    def write(self, note: Note, cmd: Write) -> list[Event]:
        return [Written(str(cmd.text))]


class Notes(Projection):
    name = "notes"
    aggregate = Note
    key = "note_id"
    columns = {"size": int, "ticks": int}
    defaults = {"size": 0, "ticks": 0}

    def on_written(self, view: dict, event: Written) -> None:
        view["size"] += len(event.text)


app = App("badin", aggregates=[Note], handlers=[NoteHandler], projections=[Notes])

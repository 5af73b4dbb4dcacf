"""What a recorded position of the commands topic says: its writer, a lane's hold, a bridge's
lease (cqrs.processor.state_table.Position)."""

from __future__ import annotations

from cqrs.processor.state_table import BRIDGE_MARK, HELD_MARK, Position, bridged


def test_a_plain_position_names_its_writer_and_nothing_else() -> None:
    pos = Position(7, "abc123")
    assert (pos.owner, pos.held, pos.lease_until) == ("abc123", False, None)


def test_a_held_position_names_its_writer() -> None:
    pos = Position(7, "abc123" + HELD_MARK)
    assert (pos.owner, pos.held, pos.lease_until) == ("abc123", True, None)


def test_a_bridged_position_carries_its_lease_to_the_millisecond() -> None:
    writer = bridged("abc123", 1_800_000_000.1234)
    assert writer == "abc123" + BRIDGE_MARK + "1800000000123"
    pos = Position(7, writer)
    assert (pos.owner, pos.held) == ("abc123", False)
    assert pos.lease_until == 1_800_000_000.123

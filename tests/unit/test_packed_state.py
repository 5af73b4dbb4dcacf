"""A state row's packed cell (:meth:`StoredAggregate.packed`): what the aggregate-state table
stores and a worker keeps for the states it evicts from its decoded cache."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cqrs.processor.state_table import StateTableError, StoredAggregate

rows = st.builds(
    StoredAggregate,
    aggregate_id=st.text(min_size=1, max_size=40),
    aggregate_type=st.text(min_size=1, max_size=40),
    version=st.integers(0, 2**63 - 1),
    deleted=st.booleans(),
    record=st.binary(max_size=300),
    source_partition=st.integers(-1, 2**31 - 1),
    applied_offset=st.integers(-1, 2**63 - 1),
    commands=st.integers(0, 2**63 - 1),
)


@given(rows)
def test_a_packed_state_unpacks_to_the_same_row(row: StoredAggregate) -> None:
    assert StoredAggregate.unpacked(row.aggregate_id, row.aggregate_type, row.packed()) == row


@pytest.mark.parametrize("cell", [b"", b"\x00" * 40, b"\x02" + b"\x00" * 40, b"\x01\x00"])
def test_a_cell_that_is_not_a_packed_state_is_refused_with_what_to_do(cell: bytes) -> None:
    with pytest.raises(StateTableError, match=r"acc-1.*cqrs rebuild-state"):
        StoredAggregate.unpacked("acc-1", "bank.Account", cell)

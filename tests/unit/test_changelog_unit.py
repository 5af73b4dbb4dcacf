"""The state changelog's pure parts: its keys, the newest record of a key, the setting."""

from __future__ import annotations

import pytest

from cqrs.config import CqrsConfig
from cqrs.errors import ConfigError
from cqrs.processor.changelog import (
    ChangelogError, changelog_key, changelog_topic, packed_commands, split_changelog_key,
    uses_changelog,
)
from cqrs.processor.state_table import StoredAggregate


def test_keys_name_the_type_and_the_id_and_split_back() -> None:
    key = changelog_key("bank.Account", "acc/1 é")
    assert split_changelog_key(key) == ("bank.Account", "acc/1 é")
    with pytest.raises(ChangelogError, match="is not '<type> NUL <id>'"):
        split_changelog_key(b"no-separator")


def test_the_command_count_is_read_from_the_packed_row() -> None:
    row = StoredAggregate("a", "T", 3, False, b"record", 2, 41, 1234567)
    assert packed_commands(row.packed()) == 1234567


def test_the_topic_is_one_per_generation() -> None:
    assert changelog_topic("t-bank", 3) == "t-bank.state.g3"


def test_the_store_setting_is_checked_with_what_to_use() -> None:
    cfg = CqrsConfig()
    assert uses_changelog(cfg) is False
    assert uses_changelog(cfg.with_overrides(processor={"state_store": "kafka"})) is True
    with pytest.raises(ConfigError, match=r"processor.state_store = 'rocksdb': use one of "
                                          r"\['cassandra', 'kafka'\]"):
        uses_changelog(cfg.with_overrides(processor={"state_store": "rocksdb"}))

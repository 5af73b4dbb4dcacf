"""KafkaSchemaStore against a real broker: compacted topic, read back by a fresh store."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from cqrs.codec import Codec, check_compatibility
from cqrs.codec.kafka_schema_store import KafkaSchemaStore
from cqrs.config import CqrsConfig
from cqrs.errors import UnknownSchemaError
from cqrs.testing.example import Account, Deposited

pytestmark = pytest.mark.integration


def _store(cfg: CqrsConfig, topic: str) -> KafkaSchemaStore:
    return KafkaSchemaStore(
        cfg.kafka.bootstrap_servers, topic=topic, client_options=cfg.kafka.client_options()
    )


def test_schemas_survive_in_a_compacted_topic(cqrs_config: CqrsConfig, unique_name: str) -> None:
    writer_store = _store(cqrs_config, unique_name)
    data = Codec([Deposited, Account], store=writer_store).encode(Deposited(42))
    writer_store.close()

    admin = AdminClient({"bootstrap.servers": cqrs_config.kafka.bootstrap_servers,
                         **cqrs_config.kafka.client_options()})  # fmt: skip
    resource = ConfigResource(ConfigResource.Type.TOPIC, unique_name)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact"

    reader_store = _store(cqrs_config, unique_name)  # a new process: reads the topic on start
    assert [s["cqrs.type"] for s in reader_store.all().values()] == ["example.bank.Deposited"]
    codec = Codec([Deposited, Account], store=reader_store)
    check_compatibility(reader_store, codec)
    assert codec.decode(data) == Deposited(42)
    with pytest.raises(UnknownSchemaError, match=unique_name):
        reader_store.get(b"\x00" * 8)

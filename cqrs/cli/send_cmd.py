"""``cqrs send`` (one command, optionally waiting for its result) and ``cqrs serve`` (HTTP API)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cqrs.config import CqrsConfig

__all__ = ["EXIT_NOT_ACCEPTED", "EXIT_TIMEOUT", "read_data", "register"]

EXIT_NOT_ACCEPTED = 1  # the command was rejected or failed
EXIT_TIMEOUT = 3  # no result in time (resend with --command-id)


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    send = commands.add_parser(
        "send", help="send one command to an app (and wait for its result with --wait)",
        description="Exit status: 0 sent / accepted, 1 rejected or failed, 2 bad input (one "
        "line on stderr: data that does not fit the command, an aggregate id that is empty or "
        "too long for its state row, a command over Kafka's record limit) or not delivered, "
        "3 no result within --timeout (resending with the same --command-id is safe).")
    send.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    send.add_argument("command_type", help="command type name (e.g. example.bank.Deposit) or "
                      "its class name (Deposit)")
    send.add_argument("aggregate_id", help="the aggregate the command is for")
    send.add_argument("--data", default="{}", metavar="JSON",
                      help="the command's fields as a JSON object, or @FILE (default: {})")
    send.add_argument("--expect", type=int, default=None, metavar="N", dest="expected_version",
                      help="expected aggregate version: 0 = must be new, N = exactly N")
    send.add_argument("--wait", action="store_true", help="wait for the result and print it")
    send.add_argument("--timeout", type=float, default=None, metavar="S",
                      help="seconds to wait with --wait (default: client.timeout_s)")
    send.add_argument("--command-id", default=None, metavar="ID",
                      help="idempotency key (default: a random UUID); reuse it to resend safely")
    send.add_argument("--correlation-id", default=None, metavar="ID")
    send.add_argument("--wait-conversation", action="store_true",
                      help="with --wait: after an accepted result, also wait for the end of the "
                      "conversation the command started (process managers) and print it")
    send.set_defaults(run=_run_send)

    serve = commands.add_parser("serve", help="serve an app's HTTP API (commands, results, state)")
    serve.add_argument("app", help="the App, as module:attribute")
    serve.add_argument("--host", default=None, help="address to listen on (default: client.http_host)")
    serve.add_argument("--port", type=int, default=None, help="port (default: client.http_port)")
    serve.add_argument("--routes", action="append", default=[], metavar="MODULE:FACTORY",
                       help="add routes from a factory routes(ctx) -> APIRouter (repeatable), "
                       "e.g. projection read models")
    serve.set_defaults(run=_run_serve)


def read_data(text: str) -> str:
    """The ``--data`` text: inline JSON, or the content of ``@FILE``."""
    from cqrs.client.errors import CommandDataError

    if text.startswith("@"):
        try:
            return Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandDataError(f"cannot read --data file {text[1:]!r}: {exc.strerror}") from None
    return text


def _run_send(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.client import (
        CommandClient, CommandTimeoutError, command_from_json, encode_command, to_jsonable,
    )
    from cqrs.client.command_client import check_ids
    from cqrs.loading import load_app
    from cqrs.personal.stack import key_store_for

    app = load_app(args.app)
    command = command_from_json(app, args.command_type, read_data(args.data))  # before Kafka
    check_ids(args.aggregate_id, args.command_id, args.correlation_id, args.expected_version)
    # the record's checks too (id and type within Cassandra's key, size within Kafka's limit),
    # personal fields encrypted as they will be sent (a missing master key is said here)
    key_store = key_store_for(cfg, app)
    codec = app.codec if key_store is None else app.codec_for(app.codec.store, key_store=key_store)
    encode_command(app, args.aggregate_id, command, expected_version=args.expected_version,
                   command_id=args.command_id, correlation_id=args.correlation_id,
                   max_record_bytes=cfg.kafka.max_record_bytes(), codec=codec)
    with CommandClient(app, cfg) as client:
        future = client.send(args.aggregate_id, command, args.expected_version, args.command_id,
                             args.correlation_id)
        if not args.wait:
            if client.flush() != 0:
                print(f"cqrs: error: command {future.command_id} not delivered", file=sys.stderr)
                return 2
            print(json.dumps({"command_id": future.command_id, "status": "sent"}))
            return 0
        try:
            result = client.wait(future, args.timeout)
        except CommandTimeoutError as exc:
            print(f"cqrs: timeout: {exc}\nresend: --command-id {exc.command_id}", file=sys.stderr)
            return EXIT_TIMEOUT
        print(json.dumps(to_jsonable(result), indent=2), flush=True)
        if not (result.accepted and args.wait_conversation):
            return 0 if result.accepted else EXIT_NOT_ACCEPTED
        from cqrs.client.conversations import ConversationTimeoutError, outcome_json

        try:
            outcome, event = client.wait_conversation(args.correlation_id or result.command_id,
                                                      args.timeout)
        except ConversationTimeoutError as exc:
            print(f"cqrs: timeout: {exc}", file=sys.stderr)
            return EXIT_TIMEOUT
    print(json.dumps({"conversation": outcome_json(outcome, event)}, indent=2))
    return 0


def _run_serve(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    import uvicorn

    from cqrs.collector import freeze_loaded
    from cqrs.http import HttpContext, create_http_app
    from cqrs.loading import load_app, load_object
    from cqrs.personal.stack import require_master_key

    app = load_app(args.app)
    require_master_key(cfg, app)  # personal fields: said now, not at the first request
    extra = [load_object(ref, "route factory") for ref in args.routes]
    if app.projections and "projections.http:routes" not in args.routes:
        from projections.http import routes as projection_routes  # the CLI sees both sides

        extra.insert(0, projection_routes)
    probes: list[Any] = []  # status-page figures beyond Kafka's
    if app.projections:
        from projections.status_probe import ProjectionProbe  # positions on the status page

        probes.append(ProjectionProbe.for_app)
    ctx = HttpContext(app, cfg)
    from cqrs.cli.forget_cmd import forget_steps

    ctx.forget_steps = forget_steps(app)  # forgetting rewrites the read models too
    api = create_http_app(ctx, extra, status_probes=probes)
    host = args.host or cfg.client.http_host
    port = args.port if args.port is not None else cfg.client.http_port
    print(f"serving {app.name!r} on http://{host}:{port} (OpenAPI: /docs)", flush=True)
    freeze_loaded()  # a full collection then walks what requests left, not the loaded modules
    uvicorn.run(api, host=host, port=port, log_level="warning")
    return 0

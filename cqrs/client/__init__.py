"""Sending commands to an app (the full client arrives with the client issue)."""

from __future__ import annotations

from cqrs.client.encoding import encode_command

__all__ = ["encode_command"]

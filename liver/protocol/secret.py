"""The job's secret: what only its controller, its node agents and its workers hold.

It comes from the job's token (the control endpoint's bearer token, which every node agent already
needs to register), so no new secret travels: ``of_token``. An agent hands it to the workers it
starts in their environment (``ENV``), never in a file. With it:

- every key of the job's store lives under a prefix made from the secret (``protocol.store.run_store``):
  a process that reaches the store's port but does not hold the secret can neither read nor write
  any key the job uses (its plans, decisions, wishes, its groups' rendezvous);
- what is unpickled from the store (the controller's transfer plan) is sealed with a message
  authentication code over its key and its bytes (``seal``, ``unseal``): bytes that someone else
  wrote, or a plan moved to another key, are refused before anything is unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import os

ENV = "LIVER_JOB_SECRET"
_MAC = 32  # bytes of an HMAC-SHA256


class Forged(ValueError):
    """Bytes from the store whose authentication code is not the job's."""


def of_token(token: str) -> bytes:
    if not token:
        raise ValueError("token: the job's token is empty; allowed: the controller's (control.json)")
    return hashlib.sha256(b"liver job secret\0" + token.encode()).digest()


def from_env() -> bytes:
    """This worker's job secret, as its agent gave it."""
    value = os.environ.get(ENV, "")
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        secret = b""
    if len(secret) != 32:
        raise RuntimeError(f"{ENV} is {'not set' if not value else 'not 64 hex digits'}: a worker gets the job's "
                           "secret from the node agent that starts it")
    return secret


def env(secret: bytes) -> dict[str, str]:
    """The environment that hands ``secret`` to a worker."""
    return {ENV: secret.hex()}


def tag(secret: bytes, what: str) -> str:
    """A name nobody without the secret can make (a store prefix)."""
    return hmac.new(secret, what.encode(), hashlib.sha256).hexdigest()[:32]


def seal(secret: bytes, key: str, payload: bytes) -> bytes:
    return hmac.new(secret, key.encode() + b"\0" + payload, hashlib.sha256).digest() + payload


def unseal(secret: bytes, key: str, blob: bytes) -> bytes:
    """``payload`` of ``seal(secret, key, payload)``; ``Forged`` for anything else."""
    mac, payload = blob[:_MAC], blob[_MAC:]
    if len(blob) < _MAC or not hmac.compare_digest(mac, hmac.new(secret, key.encode() + b"\0" + payload,
                                                                  hashlib.sha256).digest()):
        raise Forged(f"store key {key!r}: {len(blob)} bytes not sealed with the job's secret: refused unread")
    return payload

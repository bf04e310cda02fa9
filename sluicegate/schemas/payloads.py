"""Sealing payloads: every copy of an `encrypt_payloads` workflow's payload that sluicegate
keeps (stage topics and stores, admitted starts, the runs table, dead letters) is sealed.

A sealed payload is ``sg1:<key id>:<Fernet token>`` (ASCII). Fernet (from `cryptography`)
is authenticated encryption: AES-128-CBC with an HMAC-SHA256 over the whole token, so a
payload that was altered, or sealed under another key, does not open. JSON cannot begin
with ``s``, so the marker tells sealed bytes from a plain payload without a flag.

Keys come from `Settings.encryption_keys`: ``id:key,id:key,...``, newest first, each key
32 bytes in base64 (url-safe or standard, what `Fernet.generate_key()` prints). The newest
seals; every listed key opens what it sealed, which is the rotation story: prepend a new
key, and drop an old one only once nothing sealed under it is still kept. See
docs/decisions/payload-encryption.md.
"""

from __future__ import annotations

import base64
import binascii
import json
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import Workflow
from sluicegate.schemas import codec

MARKER = b"sg1:"
_KEY_BYTES = 32


class KeyringError(ValueError):
    """`Settings.encryption_keys` does not parse: the process refuses to start."""


class SealError(codec.DecodeError):
    """A sealed payload that no configured key opens (unknown key id, or altered bytes)."""


def is_sealed(raw: bytes) -> bool:
    return raw.startswith(MARKER)


def generate_key(key_id: str) -> str:
    """A fresh `id:key` entry for `Settings.encryption_keys`."""
    return f"{key_id}:{Fernet.generate_key().decode()}"


class Keyring:
    """The configured keys, newest first: the first seals, any opens what it sealed."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyringError("no encryption keys given")
        self.ids = tuple(key_id for key_id, _ in keys)
        self._fernets = {key_id: Fernet(base64.urlsafe_b64encode(raw)) for key_id, raw in keys}
        self._newest = self.ids[0]
        self._prefix = MARKER + self._newest.encode() + b":"

    @classmethod
    def parse(cls, text: str) -> Keyring:
        keys: list[tuple[str, bytes]] = []
        for position, entry in enumerate(part.strip() for part in text.split(",")):
            key_id, sep, encoded = entry.partition(":")
            key_id = key_id.strip()
            where = f"encryption key {position + 1} ({key_id or 'no id'})"
            if not sep or not key_id:
                raise KeyringError(f"{where}: write it as id:base64key (entries are "
                                   "comma-separated, newest first)")
            if key_id in (k for k, _ in keys):
                raise KeyringError(f"{where}: the id {key_id!r} is listed twice; every key "
                                   "needs its own id, since a sealed payload names its key")
            keys.append((key_id, _decode_key(encoded.strip(), where)))
        return cls(keys)

    def seal(self, plain: bytes) -> bytes:
        return self._prefix + self._fernets[self._newest].encrypt(plain)

    def open(self, sealed: bytes) -> bytes:
        key_id, sep, token = sealed[len(MARKER):].partition(b":")
        name = key_id.decode("ascii", "replace")
        fernet = self._fernets.get(name)
        if not sep or fernet is None:
            raise SealError(f"payload sealed under key {name!r}, which is not among the "
                            f"configured encryption keys ({', '.join(self.ids)})")
        try:
            return fernet.decrypt(token)
        except InvalidToken:
            raise SealError(f"payload sealed under key {name!r} does not open with that key: "
                            "it was altered, or the key was replaced under the same id"
                            ) from None


def _decode_key(encoded: str, where: str) -> bytes:
    padded = encoded + "=" * (-len(encoded) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{where}: the key is not base64") from None
    if len(raw) != _KEY_BYTES:
        raise KeyringError(f"{where}: the key is {len(raw)} bytes, it must be {_KEY_BYTES} "
                           "(make one with sluicegate.schemas.payloads.generate_key)")
    return raw


class Payloads:
    """Payload bytes in and out, sealed where the workflow declares `encrypt_payloads`.

    Opening goes by the marker, not the declaration, so a start queued before a redeploy
    that switched encryption on or off still opens."""

    def __init__(self, keys: Keyring | None) -> None:
        self.keys = keys

    @staticmethod
    def of(settings: Settings) -> Payloads:
        return _payloads(settings.encryption_keys.strip())

    def open_bytes(self, raw: bytes) -> bytes:
        """The payload's JSON bytes."""
        if not raw.startswith(MARKER):
            return raw
        if self.keys is None:
            raise SealError("payload is sealed and no encryption keys are configured "
                            "(Settings.encryption_keys / SLUICEGATE_ENCRYPTION_KEYS)")
        return self.keys.open(raw)

    def open(self, raw: bytes) -> Any:
        """The payload as data."""
        if not raw.startswith(MARKER):
            return json.loads(raw)
        return json.loads(self.open_bytes(raw))

    def seal_bytes(self, wf_or_flag: Workflow | bool, plain: bytes) -> bytes:
        """JSON bytes as a workflow keeps them: sealed if it declares encrypt_payloads (or,
        for a workflow no longer declared, if its payloads were sealed: pass that flag)."""
        sealed = wf_or_flag if isinstance(wf_or_flag, bool) else wf_or_flag.encrypt_payloads
        if not sealed or plain.startswith(MARKER):
            return plain
        if self.keys is None:
            # App validation refuses this declaration without keys; a second guard, since
            # the alternative is a plaintext copy of a payload declared encrypted.
            raise SealError("encrypt_payloads is declared but no encryption key is "
                            "configured")
        return self.keys.seal(plain)

    def seal(self, wf: Workflow, data: Any) -> bytes:
        """`data` as `wf`'s payload bytes."""
        return self.seal_bytes(wf, codec.dump_payload(data))

    def for_report(self, raw: bytes, handler: Workflow) -> Any:
        """A failed run's payload as its onFailure handler's report carries it: opened only
        for a handler that seals its own payload, so the report never holds it in clear;
        otherwise the sealed text, which the handler can open itself."""
        if raw.startswith(MARKER) and not handler.encrypt_payloads:
            return raw.decode("ascii")
        return self.open(raw)


def validate(model: type[BaseModel], document: bytes) -> None:
    """Validate a payload as the JSON document it is (pydantic's JSON mode, where an ISO
    string is a datetime even in a strict model); raises pydantic's ValidationError
    (docs/decisions/payload-validation.md)."""
    model.__pydantic_validator__.validate_json(document)


@lru_cache(maxsize=8)
def _payloads(keys: str) -> Payloads:
    return Payloads(Keyring.parse(keys) if keys else None)

"""The `Toolfleet-Signature` of webhooks (docs/API.md, Webhooks).

The header is `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, keyed
with the bytes of the tenant's webhook secret as written in the
configuration (or as kept in `data_dir/webhook-secret`), over the raw body
of the POST exactly as it arrived.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Mapping

__all__ = ["SIGNATURE_HEADER", "DELIVERY_HEADER", "sign_webhook", "verify_webhook"]

SIGNATURE_HEADER = "Toolfleet-Signature"
DELIVERY_HEADER = "Toolfleet-Delivery"


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _mac(secret: str | bytes, t: str, body: str | bytes) -> str:
    return hmac.new(_bytes(secret), t.encode("ascii") + b"." + _bytes(body), hashlib.sha256).hexdigest()


def sign_webhook(secret: str | bytes, t: int, body: str | bytes) -> str:
    """The header value toolfleet sends for `body` at Unix time `t`."""
    return f"t={t},v1={_mac(secret, str(t), body)}"


def _header(headers: Mapping[str, str] | object, name: str) -> str | None:
    get = getattr(headers, "get", None)
    if get is None:
        return None
    value = get(name)
    if value is not None:
        return str(value)
    # A plain dict: look again without case.
    items = getattr(headers, "items", None)
    if items is not None:
        for key, val in items():
            if str(key).lower() == name.lower():
                return str(val)
    return None


def verify_webhook(
    secret: str | bytes,
    headers: Mapping[str, str] | object,
    body: str | bytes,
    *,
    tolerance_s: float | None = 300,
    now: float | None = None,
) -> bool:
    """Whether `body` (the raw request body, as received) carries a valid
    `Toolfleet-Signature` in `headers` (any mapping; names compared without
    case) under `secret`. With `tolerance_s` (default 5 minutes; None turns
    it off) the signature's `t` must also be within that many seconds of
    `now` (default the clock), so a recorded notice cannot be replayed
    later. Each delivery attempt is signed anew at its own time."""
    header = _header(headers, SIGNATURE_HEADER)
    if not header:
        return False
    t: str | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            t = value
        elif key == "v1":
            signatures.append(value)
    if t is None or not (t.isascii() and t.isdigit()) or not signatures:
        return False
    if tolerance_s is not None:
        clock = time.time() if now is None else now
        if abs(clock - int(t)) > tolerance_s:
            return False
    expected = _mac(secret, t, body)
    return any(hmac.compare_digest(expected, sig.lower()) for sig in signatures)

"""Volunteers who last (``Volunteers``, a part of the relay): a page proves a key it keeps when it joins.

The page keeps an ECDSA P-256 key pair that WebCrypto made non-extractable, in IndexedDB (``web/src/identity.js``):
the private key never leaves the browser, not even to the page's own scripts. To join as its volunteer, a worker
asks the relay for a challenge (``POST /api/challenge``: random, single-use, valid for ``CHALLENGE_SECONDS``), signs
``"peertrain-join:" + challenge`` with the key, and joins with the public key (SPKI, base64) and the signature
(WebCrypto's raw r || s, base64). The volunteer is the sha256 of the public key: the same browser profile is the
same volunteer on a reload, in a new tab, in each of its workers and in the next session on the same relay; another
profile is another volunteer. Credit, the record that earns trust (``server.relay.coverage``) and bans follow the
volunteer, not the token.

A forged proof (a signature that does not verify, a challenge the relay did not give or gave to someone already)
is refused ``403 volunteer_proof``; a malformed one (not base64, not a P-256 key, a name over its length) ``400
bad_volunteer``. A key is free to make, so a new key is a new stranger: its first result is replayed like any new
peer's, it starts with no credit and no record, and a banned volunteer's new key starts from nothing too. What keys
change for sybils: nothing an attacker can buy with a fresh key, and a volunteer's record is no longer lost on a
reload (so an honest volunteer earns trust once, and a ban sticks to every tab of the key that earned it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.serialization import load_der_public_key

from server.relay.context import Part, RelayContext
from server.relay.refusal import Refusal

CHALLENGE_SECONDS = 300.0  # how long a challenge may wait for its join (a join queued at 429 asks for a new one)
MAX_CHALLENGES = 100_000  # kept at once; past that the oldest go (a flood only makes pages ask again)
MAX_NAME_CHARS = 40  # a display name or a team
MAX_KEY_CHARS = 200  # base64 of a P-256 SubjectPublicKeyInfo is 124
SIGNED_PREFIX = "peertrain-join:"


@dataclass(frozen=True)
class VolunteerProof:
    public_key: str  # SPKI DER, base64
    challenge: str
    signature: str  # r || s, base64 (WebCrypto's ECDSA signature)
    name: str | None = None
    team: str | None = None

    @property
    def volunteer_id(self) -> str:
        return volunteer_id(self.public_key)


def volunteer_id(public_key: str) -> str:
    """The volunteer a key is: the first 32 hex digits of the sha256 of its SPKI bytes."""
    return hashlib.sha256(base64.b64decode(public_key)).hexdigest()[:32]


def profile_text(value: Any, what: str) -> str | None:
    """A display name or team: None (leave it), or printable text of at most ``MAX_NAME_CHARS``, trimmed."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise Refusal(400, "bad_volunteer", f"{what} must be printable text of at most {MAX_NAME_CHARS} characters")
    return value.strip()


def parse_proof(value: Any) -> VolunteerProof | None:
    """A join's ``volunteer`` object, checked for form (not yet for its signature); None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Refusal(400, "bad_volunteer", "volunteer must be an object {public_key, challenge, signature}")
    key, challenge, signature = (value.get(name) for name in ("public_key", "challenge", "signature"))
    if not all(isinstance(field, str) and 0 < len(field) <= MAX_KEY_CHARS for field in (key, challenge, signature)):
        raise Refusal(400, "bad_volunteer", "volunteer needs public_key, challenge and signature as short text")
    return VolunteerProof(str(key), str(challenge), str(signature), name=profile_text(value.get("name"), "name"),
                          team=profile_text(value.get("team"), "team"))


def check_signature(proof: VolunteerProof) -> None:
    """The proof's signature over its challenge, by its key; refused when it is not one."""
    try:
        key = load_der_public_key(base64.b64decode(proof.public_key, validate=True))
        raw = base64.b64decode(proof.signature, validate=True)
    except (ValueError, binascii.Error, TypeError) as error:
        raise Refusal(400, "bad_volunteer", f"the volunteer key or signature is not readable: {error}") from error
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1) or len(raw) != 64:
        raise Refusal(400, "bad_volunteer", "the volunteer key must be ECDSA P-256 and its signature 64 bytes (r, s)")
    signature = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    try:
        key.verify(signature, (SIGNED_PREFIX + proof.challenge).encode(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as error:
        raise Refusal(403, "volunteer_proof", "the signature does not prove the volunteer key") from error


class Volunteers(Part):
    """The challenges given out and not yet used, and a join's proof of its volunteer."""

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self._challenges: OrderedDict[str, float] = OrderedDict()  # challenge -> until when it is good (monotonic)

    def challenge(self) -> dict[str, Any]:
        now = time.monotonic()
        while self._challenges and (len(self._challenges) >= MAX_CHALLENGES
                                    or next(iter(self._challenges.values())) < now):
            self._challenges.popitem(last=False)
        challenge = secrets.token_urlsafe(24)
        self._challenges[challenge] = now + CHALLENGE_SECONDS
        return {"challenge": challenge, "expires_seconds": CHALLENGE_SECONDS, "signs": SIGNED_PREFIX + "<challenge>"}

    def prove(self, proof: VolunteerProof) -> str:
        """The volunteer ``proof`` proves (its challenge used up); refused when it proves none or is banned."""
        check_signature(proof)  # (before the challenge is spent: a malformed try does not use up a good challenge)
        until = self._challenges.pop(proof.challenge, None)
        if until is None or until < time.monotonic():
            raise Refusal(403, "volunteer_proof", "the challenge is unknown, used or expired: ask for a new one")
        volunteer = proof.volunteer_id
        reason = self.store.volunteer_banned(volunteer)
        if reason is not None:
            raise Refusal(403, "banned", f"this volunteer is banned: {reason}")
        return volunteer

    def attach(self, peer_id: str, proof: VolunteerProof) -> None:
        self.store.attach_volunteer(peer_id, proof.volunteer_id, proof.public_key, name=proof.name, team=proof.team)

    def set_profile(self, peer_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A volunteer's peer changes its name or team (``POST /api/volunteer``)."""
        volunteer = self.store.volunteer_of(peer_id)
        if not volunteer:
            raise Refusal(409, "no_volunteer", "this peer joined without a volunteer key")
        name, team = profile_text(payload.get("name"), "name"), profile_text(payload.get("team"), "team")
        self.store.set_profile(volunteer, name=name, team=team)
        self.context.notices.changed()
        return {"volunteer": volunteer} | {k: v for k, v in self.store.volunteers()[volunteer].items()
                                           if k in ("name", "team")}

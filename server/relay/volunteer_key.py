"""A volunteer key on the host's side: what a page keeps in IndexedDB (``web/src/identity.js``), for native peers
and tests that join as a volunteer (``RelayClient.join(volunteer=...)``). ECDSA P-256 with SHA-256, the signature
as WebCrypto gives it (r || s, 32 bytes each), the public key as SubjectPublicKeyInfo; see ``server.relay.volunteers``
for what the relay checks."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from server.relay.volunteers import SIGNED_PREFIX, volunteer_id


@dataclass
class VolunteerKey:
    private: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    name: str | None = None
    team: str | None = None

    @property
    def public_key(self) -> str:
        der = self.private.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(der).decode()

    @property
    def volunteer(self) -> str:
        return volunteer_id(self.public_key)

    def sign(self, challenge: str) -> str:
        r, s = decode_dss_signature(self.private.sign((SIGNED_PREFIX + challenge).encode(), ec.ECDSA(hashes.SHA256())))
        return base64.b64encode(r.to_bytes(32, "big") + s.to_bytes(32, "big")).decode()

    def proof(self, challenge: str) -> dict[str, Any]:
        """The join's ``volunteer`` object for ``challenge`` (from ``POST /api/challenge``)."""
        profile = {key: value for key, value in (("name", self.name), ("team", self.team)) if value is not None}
        return {"public_key": self.public_key, "challenge": challenge, "signature": self.sign(challenge)} | profile

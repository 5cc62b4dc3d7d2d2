"""
OpenSSH public keys as a tenant saves them: parsed, checked and fingerprinted, not just stored.

Accepted: ``ssh-ed25519``, ``ecdsa-sha2-nistp256/384/521`` and ``ssh-rsa`` of at least 3,072
bits (smaller RSA keys and DSA are refused, as current OpenSSH refuses them). The fingerprint
is OpenSSH's own (``ssh-keygen -lf``): ``SHA256:`` and the unpadded base64 of the SHA-256 of the
key's wire blob. Pure: text in, a ``ParsedKey`` or a ValueError saying what is wrong out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

MAX_LENGTH = 16_384
MIN_RSA_BITS = 3072
KINDS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")


@dataclass(frozen=True)
class ParsedKey:
    kind: str  # the OpenSSH key type, e.g. "ssh-ed25519"
    bits: int
    fingerprint: str  # "SHA256:..." as ssh-keygen prints it
    comment: str
    line: str  # "<type> <base64>" (the comment is kept apart)

    @property
    def authorized_keys_line(self) -> str:
        return f"{self.line} {self.comment}".strip()


def parse_public_key(text: str) -> ParsedKey:
    """The key in ``text`` (one OpenSSH public key line), or ValueError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("Paste an OpenSSH public key (the one line of your id_ed25519.pub).")
    if len(text) > MAX_LENGTH:
        raise ValueError(f"A public key is at most {MAX_LENGTH} characters.")
    text = text.strip()
    if "PRIVATE KEY" in text:
        raise ValueError("This is a private key: paste the public one (the .pub file), and keep this one secret.")
    if "\n" in text or "\r" in text:
        raise ValueError("Paste one key on one line.")
    parts = text.split(None, 2)
    if len(parts) < 2:
        raise ValueError("An OpenSSH public key reads '<type> <base64> [comment]', "
                         "e.g. 'ssh-ed25519 AAAA... you@host'.")
    kind, blob_b64 = parts[0], parts[1]
    comment = parts[2].strip() if len(parts) > 2 else ""
    if kind == "ssh-dss":
        raise ValueError("DSA keys are refused (OpenSSH no longer accepts them): use ed25519.")
    if kind not in KINDS:
        raise ValueError(f"Unsupported key type '{kind[:40]}': use ssh-ed25519, ecdsa-sha2-nistp256/384/521 or "
                         f"ssh-rsa of at least {MIN_RSA_BITS} bits.")
    try:
        blob = base64.b64decode(blob_b64, validate=True)
        key = load_ssh_public_key(f"{kind} {blob_b64}".encode())
    except (binascii.Error, ValueError, UnsupportedAlgorithm):
        raise ValueError("The key's base64 part is damaged: copy the whole line again.") from None
    if isinstance(key, rsa.RSAPublicKey):
        bits = key.key_size
        if bits < MIN_RSA_BITS:
            raise ValueError(f"This RSA key has {bits} bits; use at least {MIN_RSA_BITS} (or an ed25519 key).")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        bits = key.curve.key_size
    elif isinstance(key, ed25519.Ed25519PublicKey):
        bits = 256
    else:  # pragma: no cover -- every kind above loads as one of these
        raise ValueError(f"Unsupported key type '{kind}'.")
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return ParsedKey(kind=kind, bits=bits, fingerprint=f"SHA256:{digest}", comment=comment[:200],
                     line=f"{kind} {blob_b64}")

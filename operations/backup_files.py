"""
A backup's files: the manifest and its digests, and the key material sealed for the operator.

The key ring (MERIDIAN_ENCRYPTION_KEYS), the secret key the audit chain's key is derived from
(and MERIDIAN_AUDIT_CHAIN_KEY when set) are not in the database, and without them a restored
database is of little use: its stored secrets do not decrypt and its audit chain does not verify.
They never sit in the clear beside the dump: they are sealed with a passphrase the operator keeps
elsewhere (MERIDIAN_BACKUP_PASSPHRASE, or a file named on the command line), with scrypt and
AES-256-GCM, so whoever holds the backup store alone holds ciphertext (the dump's own secrets are
encrypted with that ring). The sealed file also carries the digests of the backup's other files:
a manifest rewritten along with a dump no longer matches what was sealed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

MANIFEST = "manifest.json"
KEYS_FILE = "keys.enc"
FORMAT = "meridian-backup/1"
KEYS_FORMAT = "meridian-backup-keys/1"
PASSPHRASE_ENV = "MERIDIAN_BACKUP_PASSPHRASE"
MIN_PASSPHRASE = 12
# scrypt's cost: OWASP's recommended minimum (2**17, 8, 1), about 128 MiB and a fraction of a second.
SCRYPT = {"n": 2**17, "r": 8, "p": 1}
_CHUNK = 1 << 20


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says why and what to do."""


@dataclass
class Keys:
    """The key material a backup carries: what a restored database needs besides itself."""

    encryption_keys: list[str]
    secret_key: str
    audit_chain_key: str = ""
    files: dict = field(default_factory=dict)  # the digests sealed with them

    def environment(self) -> dict[str, str]:
        """As a process reads them from the environment (config/settings.py)."""
        return {"MERIDIAN_ENCRYPTION_KEYS": ",".join(self.encryption_keys), "DJANGO_SECRET_KEY": self.secret_key}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe(path: Path) -> dict:
    return {"sha256": sha256(path), "bytes": path.stat().st_size}


def private_file(path: Path, data: bytes) -> None:
    """Write a new file only its owner can read (never over an existing one)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as stream:
        stream.write(data)


def passphrase_from(path: str | None) -> str | None:
    """The passphrase: the first line of ``path`` when given, else MERIDIAN_BACKUP_PASSPHRASE (never an argument)."""
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise BackupError(f"cannot read the passphrase file {path}: {exc.strerror or exc}") from exc
        return text[0] if text else ""
    return os.environ.get(PASSPHRASE_ENV) or None


def _key(passphrase: str, salt: bytes, params: dict) -> bytes:
    return Scrypt(salt=salt, length=32, n=params["n"], r=params["r"], p=params["p"]).derive(passphrase.encode())


def seal_keys(keys: Keys, passphrase: str) -> bytes:
    """The key material encrypted for the operator, as the bytes of a small JSON file."""
    if len(passphrase) < MIN_PASSPHRASE:
        raise BackupError(f"the backup passphrase must be at least {MIN_PASSPHRASE} characters long")
    salt, nonce = os.urandom(16), os.urandom(12)
    plain = json.dumps({"MERIDIAN_ENCRYPTION_KEYS": keys.encryption_keys, "DJANGO_SECRET_KEY": keys.secret_key,
                        "MERIDIAN_AUDIT_CHAIN_KEY": keys.audit_chain_key, "files": keys.files}).encode()
    sealed = AESGCM(_key(passphrase, salt, SCRYPT)).encrypt(nonce, plain, KEYS_FORMAT.encode())
    return json.dumps({"format": KEYS_FORMAT, "kdf": {"name": "scrypt", **SCRYPT}, "cipher": "AES-256-GCM",
                       "salt": _b64(salt), "nonce": _b64(nonce), "sealed": _b64(sealed)}, indent=1).encode()


def open_keys(path: Path, passphrase: str | None) -> Keys:
    """The key material of a sealed keys file; a wrong passphrase is refused, never guessed around."""
    if not passphrase:
        raise BackupError(f"{path.name} is sealed with a passphrase: set {PASSPHRASE_ENV} or pass --passphrase-file")
    try:
        data = json.loads(path.read_bytes())
        if data.get("format") != KEYS_FORMAT:
            raise BackupError(f"{path} is not a Meridian backup keys file")
        key = _key(passphrase, base64.b64decode(data["salt"]), data["kdf"])
        plain = AESGCM(key).decrypt(base64.b64decode(data["nonce"]), base64.b64decode(data["sealed"]),
                                    KEYS_FORMAT.encode())
    except InvalidTag as exc:
        raise BackupError(f"the passphrase does not open {path.name}: it is not the passphrase this backup was "
                          f"made with (or the file was altered); nothing was restored") from exc
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{path} is damaged: it is not a readable keys file") from exc
    payload = json.loads(plain)
    return Keys(encryption_keys=list(payload["MERIDIAN_ENCRYPTION_KEYS"]), secret_key=payload["DJANGO_SECRET_KEY"],
                audit_chain_key=payload.get("MERIDIAN_AUDIT_CHAIN_KEY", ""), files=payload.get("files", {}))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise BackupError(f"{folder} holds no {MANIFEST}: it is not a complete Meridian backup") from exc
    except (OSError, ValueError) as exc:
        raise BackupError(f"{path} cannot be read: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{path} is not a Meridian backup manifest ({FORMAT})")
    return manifest


def verify_files(folder: Path, manifest: dict, say=lambda line: None) -> None:
    """Every file the manifest lists is there with its digest; the first that is not is named."""
    for name, expected in sorted(manifest["files"].items()):
        path = folder / name
        if not path.is_file():
            raise BackupError(f"{name} is missing from the backup: restore from another backup")
        if sha256(path) != expected["sha256"]:
            raise BackupError(f"{name} does not match its sha256 in the manifest: the file was changed or "
                              "damaged since the backup was made; restore from another backup")
    say(f"files: {len(manifest['files'])} verified against the manifest's sha256")


def verify_sealed_digests(manifest: dict, keys: Keys) -> None:
    """The digests sealed with the keys are the manifest's: the manifest was not rewritten with the files."""
    listed = {name: entry["sha256"] for name, entry in manifest["files"].items() if name != KEYS_FILE}
    if keys.files and keys.files != listed:
        raise BackupError("the manifest's digests differ from those sealed with the keys: the backup was altered "
                          "after it was made; restore from another backup")

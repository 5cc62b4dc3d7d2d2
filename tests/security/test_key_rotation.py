"""
Rotating MERIDIAN_ENCRYPTION_KEYS: ``rotate_encryption_keys`` moves every stored secret to the newest
key in batches, survives being stopped half-way, never overwrites a concurrent write, and names
(without revealing) any value no configured key can decrypt.
"""

from io import StringIO
from types import SimpleNamespace

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import TextField, Value

from cloud.models import Node
from provisioning.models import NodeCredential
from security import crypto
from security.management.commands import rotate_encryption_keys as command
from security.models import ReceiptKey
from security.receipts import signing_key
from tests.world import small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def keys(settings):
    """Two fresh Fernet keys and a switch for the ring; the rows of a test start under key 1."""

    def use(*ring):
        settings.MERIDIAN_ENCRYPTION_KEYS = list(ring)
        crypto._ring.cache_clear()
        crypto._newest.cache_clear()

    ring = SimpleNamespace(k1=Fernet.generate_key().decode(), k2=Fernet.generate_key().decode(), use=use)
    use(ring.k1)
    yield ring
    crypto._ring.cache_clear()
    crypto._newest.cache_clear()


@pytest.fixture
def secrets(keys):
    """Nodes with BMC passwords and a receipt signing key, all written under key 1: {(model, pk): plaintext}."""
    written = {}
    for index, node in enumerate(small_fleet(4)):
        node.bmc_password = f"bmc-password-{index}"
        node.save(update_fields=["bmc_password"])
        written[(Node, node.pk)] = node.bmc_password
    receipt_key = signing_key()
    written[(ReceiptKey, receipt_key.pk)] = receipt_key.private_key_pem
    return written


def raw(model, pk) -> str:
    """The column as stored, bypassing the field's decryption."""
    field = _field(model)
    table, column = connection.ops.quote_name(model._meta.db_table), connection.ops.quote_name(field.column)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {model._meta.pk.column} = %s", [pk])
        return cursor.fetchone()[0]


def store_raw(model, pk, ciphertext: str) -> None:
    model.objects.filter(pk=pk).update(**{_field(model).attname: Value(ciphertext, output_field=TextField())})


def _field(model):
    return next(field for m, field in crypto.encrypted_fields() if m is model)


def read_back(model, pk) -> str:
    return getattr(model.objects.get(pk=pk), _field(model).attname)


def under(key: str, ciphertext: str) -> bool:
    try:
        Fernet(key).decrypt(ciphertext.encode())
    except InvalidToken:
        return False
    return True


def rotate(*args) -> str:
    out = StringIO()
    call_command("rotate_encryption_keys", *args, stdout=out)
    return out.getvalue()


def assert_no_secret_in(text: str, secrets: dict) -> None:
    for (model, pk), plaintext in secrets.items():
        assert plaintext not in text
        assert raw(model, pk) not in text


def test_every_encrypted_field_is_found():
    found = {(model._meta.label, field.name) for model, field in crypto.encrypted_fields()}
    assert {("cloud.Node", "bmc_password"), ("provisioning.NodeCredential", "secret"),
            ("security.ReceiptKey", "private_key_pem")} <= found


def test_empty_values_never_need_rotation(keys):
    assert not crypto.needs_rotation("") and not crypto.needs_rotation(None)
    old = Fernet(keys.k1).encrypt(b"x").decode()
    keys.use(keys.k2, keys.k1)
    assert crypto.needs_rotation(old)
    assert not crypto.needs_rotation(crypto.reencrypt(old))


def test_rotation_moves_every_row_to_the_newest_key_and_the_old_key_can_go(keys, secrets):
    assert all(under(keys.k1, raw(model, pk)) for model, pk in secrets)
    keys.use(keys.k2, keys.k1)

    output = rotate()

    for (model, pk), plaintext in secrets.items():
        assert not under(keys.k1, raw(model, pk)) and under(keys.k2, raw(model, pk))
        assert read_back(model, pk) == plaintext
    assert "cloud.Node.bmc_password:" in output and "security.ReceiptKey.private_key_pem:" in output
    assert f"Total: {len(secrets)} checked, {len(secrets)} re-encrypted" in output
    assert_no_secret_in(output, secrets)

    keys.use(keys.k2)
    assert all(read_back(model, pk) == plaintext for (model, pk), plaintext in secrets.items())


def test_a_second_run_has_nothing_to_do(keys, secrets):
    keys.use(keys.k2, keys.k1)
    rotate()
    before = {key: raw(*key) for key in secrets}
    assert "0 re-encrypted" in rotate().splitlines()[-1]
    assert {key: raw(*key) for key in secrets} == before


def test_a_rotation_killed_half_way_finishes_on_rerun_without_redoing_rows(keys, secrets, monkeypatch):
    keys.use(keys.k2, keys.k1)
    real_batch = command.rotate_batch

    def dies_after_one_batch(*args, **kwargs):
        real_batch(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "rotate_batch", dies_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        rotate("--batch-size", "1")
    done = {key for key in secrets if under(keys.k2, raw(*key))}
    assert len(done) == 1

    monkeypatch.setattr(command, "rotate_batch", real_batch)
    written = []
    real_write = command.write_if_unchanged

    def counting_write(model, field, pk, old, new):
        written.append((model, pk))
        return real_write(model, field, pk, old, new)

    monkeypatch.setattr(command, "write_if_unchanged", counting_write)
    rotate("--batch-size", "1")

    assert sorted(written, key=str) == sorted(set(secrets) - done, key=str)
    for (model, pk), plaintext in secrets.items():
        assert under(keys.k2, raw(model, pk)) and read_back(model, pk) == plaintext


def test_a_value_written_after_the_batch_was_read_is_not_overwritten(keys, secrets):
    node_pk = next(pk for model, pk in secrets if model is Node)
    stale = raw(Node, node_pk)
    keys.use(keys.k2, keys.k1)
    Node.objects.filter(pk=node_pk).update(bmc_password="changed-meanwhile")

    tally = command.rotate_batch(Node, _field(Node), [(node_pk, stale)])

    assert (tally.reencrypted, tally.raced) == (0, 1)
    assert read_back(Node, node_pk) == "changed-meanwhile"


def test_a_concurrent_writer_on_the_old_key_wins_and_the_rerun_rotates_it(keys, secrets, monkeypatch):
    node_pk = next(pk for model, pk in secrets if model is Node)
    keys.use(keys.k2, keys.k1)
    real_read = command.read_batch

    def read_then_a_writer_still_on_key_1(model, field, after, size):
        rows = real_read(model, field, after, size)
        if any(pk == node_pk for pk, _ in rows) and model is Node:
            store_raw(Node, node_pk, Fernet(keys.k1).encrypt(b"written-by-an-old-process").decode())
        return rows

    monkeypatch.setattr(command, "read_batch", read_then_a_writer_still_on_key_1)
    output = rotate("--batch-size", "2")
    assert "1 changed meanwhile" in output
    assert read_back(Node, node_pk) == "written-by-an-old-process"
    assert under(keys.k1, raw(Node, node_pk))

    monkeypatch.setattr(command, "read_batch", real_read)
    rotate()
    assert under(keys.k2, raw(Node, node_pk)) and read_back(Node, node_pk) == "written-by-an-old-process"


def test_a_value_under_an_unknown_key_fails_the_run_by_name_without_revealing_it(keys, secrets):
    node_pk = next(pk for model, pk in secrets if model is Node)
    lost = Fernet(Fernet.generate_key()).encrypt(b"plaintext-nobody-may-see").decode()
    store_raw(Node, node_pk, lost)
    keys.use(keys.k2, keys.k1)
    out = StringIO()

    with pytest.raises(CommandError) as failure:
        call_command("rotate_encryption_keys", stdout=out, stderr=out)

    message = str(failure.value)
    assert f"cloud.Node pk={node_pk} field=bmc_password" in message
    for text in (message, out.getvalue()):
        assert "plaintext-nobody-may-see" not in text and lost not in text
    assert_no_secret_in(message + out.getvalue(), {k: v for k, v in secrets.items() if k != (Node, node_pk)})
    others = [key for key in secrets if key != (Node, node_pk)]
    assert all(under(keys.k2, raw(*key)) for key in others)
    assert raw(Node, node_pk) == lost


def test_dry_run_counts_and_changes_nothing(keys, secrets):
    keys.use(keys.k2, keys.k1)
    before = {key: raw(*key) for key in secrets}

    output = rotate("--dry-run")

    assert f"{len(secrets)} would re-encrypt" in output.splitlines()[-1]
    assert {key: raw(*key) for key in secrets} == before


def test_node_credentials_are_rotated_too(keys, secrets):
    node = Node.objects.first()
    credential = NodeCredential.objects.create(node=node, key_id="rotation-test", secret="agent-secret")
    keys.use(keys.k2, keys.k1)
    rotate()
    assert under(keys.k2, raw(NodeCredential, credential.pk))
    assert NodeCredential.objects.get(pk=credential.pk).secret == "agent-secret"


def test_batch_size_must_be_positive(keys):
    with pytest.raises(CommandError, match="at least 1"):
        rotate("--batch-size", "0")

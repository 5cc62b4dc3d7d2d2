"""
Saved SSH keys: parsed and fingerprinted as OpenSSH does, a user's own or the tenant's shared
ones, picked by id when reserving, and put on the instances as they are when an instance is made
(a key removed since is not). Another tenant's key is a 404, and naming it in a reservation a 400.
"""

import re

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa

from provisioning.drivers.simulated import Simulated
from provisioning.drivers.simulated_devices import SimulatedDevice
from provisioning.lifecycle.steps import authorized_keys
from provisioning.models import Instance, Reservation
from tenants.models import SSHKey
from tenants.ssh_keys import parse_public_key
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import reservation
from tests.world import small_fleet

KEYS = "/api/v1/ssh-keys/"
URL = "/api/v1/reservations/"
# A key and the fingerprint `ssh-keygen -lf` prints for it.
VECTOR = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPGsdsYHc9iALQPfi8HQxWDD11+kfUPcq/rK+0wDyiCQ me@host"
VECTOR_FINGERPRINT = "SHA256:IHzTaEeSlXYLT1HpBnaTiw2nm0idB7cuNIletovDf6g"


def openssh(private) -> str:
    public = private.public_key()
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def new_key(comment="") -> str:
    return f"{openssh(ed25519.Ed25519PrivateKey.generate())} {comment}".strip()


#
# Parsing
#


def test_the_fingerprint_is_the_one_ssh_keygen_prints():
    parsed = parse_public_key(VECTOR)
    assert (parsed.kind, parsed.bits, parsed.fingerprint, parsed.comment) == (
        "ssh-ed25519", 256, VECTOR_FINGERPRINT, "me@host")
    assert parsed.authorized_keys_line == VECTOR


@pytest.mark.parametrize("make, kind, bits", [
    (lambda: ec.generate_private_key(ec.SECP256R1()), "ecdsa-sha2-nistp256", 256),
    (lambda: ec.generate_private_key(ec.SECP384R1()), "ecdsa-sha2-nistp384", 384),
    (lambda: rsa.generate_private_key(public_exponent=65537, key_size=3072), "ssh-rsa", 3072),
])
def test_ecdsa_and_rsa_of_3072_bits_are_taken(make, kind, bits):
    parsed = parse_public_key(openssh(make()))
    assert (parsed.kind, parsed.bits) == (kind, bits) and parsed.fingerprint.startswith("SHA256:")


@pytest.mark.parametrize("text, says", [
    ("", "Paste an OpenSSH public key"),
    ("ssh-ed25519", re.escape("reads '<type> <base64> [comment]'")),
    ("ssh-ed25519 AAAA!!notbase64", "damaged"),
    ("ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ", "damaged"),  # an RSA blob under the ed25519 name
    ("ecdsa-sha2-nistp999 AAAA", "Unsupported key type"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", "private key"),
    (VECTOR + "\n" + VECTOR, "one key on one line"),
    ("ssh-ed25519 " + "A" * 20_000, "at most"),
])
def test_what_is_not_a_usable_public_key_is_refused_saying_why(text, says):
    with pytest.raises(ValueError, match=says):
        parse_public_key(text)


def test_small_rsa_and_dsa_keys_are_refused():
    with pytest.raises(ValueError, match="2048 bits; use at least 3072"):
        parse_public_key(openssh(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    with pytest.raises(ValueError, match="DSA keys are refused"):
        parse_public_key(openssh(dsa.generate_private_key(key_size=1024)))  # noqa: S505 -- OpenSSH only has 1024


#
# The API
#


def add(world, persona, public_key, **extra):
    return world.client(persona).post(KEYS, {"name": "laptop", "public_key": public_key, **extra}, format="json")


def test_a_member_saves_a_key_and_gets_its_fingerprint(world):
    response = add(world, "t1_member", VECTOR)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["fingerprint"], body["kind"], body["bits"], body["is_shared"]) == (
        VECTOR_FINGERPRINT, "ssh-ed25519", 256, False)
    assert body["authorized_key"] == VECTOR and "public_key" not in body
    assert SSHKey.objects.get(pk=body["id"]).user == world.users["t1_member"]


def test_a_key_is_saved_once_per_tenant_and_a_bad_one_names_the_field(world):
    assert add(world, "t1_member", VECTOR).status_code == 201
    again = add(world, "t1_admin", VECTOR)
    assert again.status_code == 409 and again.json()["errors"][0]["code"] == "ssh_key_exists"
    assert add(world, "t2_member", VECTOR).status_code == 201  # another tenant holds its own copy
    bad = add(world, "t1_member", "ssh-rsa " + openssh(rsa.generate_private_key(
        public_exponent=65537, key_size=2048)).split()[1])
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["attr"] == "public_key" and "3072" in bad.json()["errors"][0]["detail"]
    assert SSHKey.objects.filter(tenant=world.t1.tenant, fingerprint=VECTOR_FINGERPRINT).count() == 1


def test_viewers_add_none_members_add_their_own_and_admins_the_shared_ones(world):
    assert add(world, "t1_viewer", new_key()).status_code == 403
    refused = add(world, "t1_member", new_key(), shared=True)
    assert refused.status_code == 403 and refused.json()["errors"][0]["code"] == "insufficient_role"
    shared = add(world, "t1_admin", new_key(), shared=True)
    assert shared.status_code == 201 and shared.json()["is_shared"] is True


def test_members_see_their_own_keys_and_the_shared_ones_admins_see_all(world):
    own = add(world, "t1_member", new_key()).json()["id"]
    shared = add(world, "t1_admin", new_key(), shared=True).json()["id"]
    admins_own = add(world, "t1_admin", new_key()).json()["id"]
    theirs = add(world, "t2_member", new_key()).json()["id"]
    listed = {k["id"] for k in world.client("t1_member").get(KEYS).json()["results"]}
    assert listed == {own, shared}
    owners = str(world.t1.objects[SSHKey].pk)  # the world's: the owner's own key
    assert {k["id"] for k in world.client("t1_admin").get(KEYS).json()["results"]} == {own, shared, admins_own, owners}
    for persona, key in (("t1_member", admins_own), ("t1_member", theirs), ("t2_member", own)):
        assert world.client(persona).get(f"{KEYS}{key}/").status_code == 404
        assert world.client(persona).delete(f"{KEYS}{key}/").status_code == 404
    assert world.client("t1_member").delete(f"{KEYS}{shared}/").status_code == 404  # a member changes only their own
    assert world.client("t1_member").delete(f"{KEYS}{own}/").status_code == 204
    assert world.client("t1_admin").delete(f"{KEYS}{shared}/").status_code == 204
    left = SSHKey.objects.filter(pk__in=[own, shared, admins_own, theirs]).values_list("pk", flat=True)
    left = {str(pk) for pk in left}
    assert left == {admins_own, theirs}


#
# Reservations
#


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def reserve(world, keys, persona="t1_member", **extra):
    body = {"name": "job", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"],
            "duration_hours": 2, "nodes": 1, "ssh_keys": keys, **extra}
    return world.client(persona).post(URL, body, format="json")


def disk_keys(instance: Instance) -> list[str]:
    state = SimulatedDevice.objects.get(key=f"disk:{instance.node.hostname}").state
    return state["ssh_key"].splitlines()


def test_the_instances_get_the_keys_named_as_they_are_when_made(world, fleet, steps):
    mine, shared = new_key("me@laptop"), new_key("team@ci")
    mine_id = add(world, "t1_member", mine).json()["id"]
    shared_id = add(world, "t1_admin", shared, shared=True).json()["id"]
    gone = add(world, "t1_member", new_key("old@box")).json()["id"]
    response = reserve(world, [mine_id, shared_id, gone, mine_id])
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    assert world.client("t1_member").delete(f"{KEYS}{gone}/").status_code == 204  # before its instance is made
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    assert disk_keys(instance) == [mine, shared]  # each once, by name then age; the removed one is not there
    assert Simulated.calls("disk", instance.node.hostname)["write_image"] == 1


def test_another_tenants_key_or_a_key_of_nobody_is_a_400_and_nothing_is_made(world, fleet):
    theirs = add(world, "t2_member", new_key()).json()["id"]
    before = Reservation.objects.count()
    for keys in ([theirs], ["00000000-0000-0000-0000-000000000000"], ["not-a-uuid"], [theirs] * 11):
        response = reserve(world, keys)
        assert response.status_code == 400, (keys, response.json())
        assert response.json()["errors"][0]["attr"].startswith("ssh_keys"), response.json()
    assert Reservation.objects.count() == before


def test_the_pasted_key_comes_first_and_each_key_once(world, fleet):
    saved = add(world, "t1_member", VECTOR).json()["id"]
    pasted = new_key("pasted@box")
    response = reserve(world, [saved], ssh_public_key=pasted)
    assert response.status_code == 201, response.json()
    held = Reservation.objects.get(pk=response.json()["id"])
    assert authorized_keys(held).splitlines() == [pasted, VECTOR]
    SSHKey.objects.filter(pk=saved).delete()
    assert authorized_keys(held).splitlines() == [pasted]

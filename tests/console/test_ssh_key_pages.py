"""The SSH keys page (save, see, remove), and the keys and images the Reserve form offers."""

import pytest
from django.urls import reverse

from cloud.models import Image
from tenants.models import SSHKey
from tests.world import ssh_key

pytestmark = pytest.mark.django_db


def test_a_member_saves_a_key_and_sees_it_with_its_fingerprint(console, world):
    client = console("t1_member")
    key = ssh_key("me@laptop")
    response = client.post(reverse("ssh-key-create"), {"name": "laptop", "public_key": key})
    assert response.status_code == 302 and response["Location"] == reverse("ssh-key-list")
    saved = SSHKey.objects.get(user=world.users["t1_member"], name="laptop")
    body = client.get(reverse("ssh-key-list")).content.decode()
    assert saved.fingerprint in body and "me@laptop" in body
    assert world.t1.objects[SSHKey].fingerprint not in body  # the owner's own key


def test_a_bad_key_is_named_on_the_form_and_nothing_is_saved(console, world):
    response = console("t1_member").post(reverse("ssh-key-create"), {"name": "old", "public_key": "ssh-dss AAAA"})
    assert response.status_code == 400
    assert "DSA keys are refused" in response.content.decode()
    assert not SSHKey.objects.filter(name="old").exists()


def test_only_admins_are_offered_to_share_a_key(console):
    assert "Shared by the whole tenant" not in console("t1_member").get(reverse("ssh-key-list")).content.decode()
    assert "Shared by the whole tenant" in console("t1_admin").get(reverse("ssh-key-list")).content.decode()


def test_removing_a_key_that_is_not_ones_own_is_a_404_and_ones_own_goes(console, world):
    theirs = world.t1.objects[SSHKey]
    assert console("t1_member").post(reverse("ssh-key-remove", args=[theirs.pk])).status_code == 404
    client = console("t1_member")
    client.post(reverse("ssh-key-create"), {"name": "laptop", "public_key": ssh_key()})
    mine = SSHKey.objects.get(user=world.users["t1_member"])
    assert client.post(reverse("ssh-key-remove", args=[mine.pk])).status_code == 302
    assert not SSHKey.objects.filter(pk=mine.pk).exists() and SSHKey.objects.filter(pk=theirs.pk).exists()


def test_the_reserve_form_offers_the_saved_keys(console, world):
    client = console("t1_member")
    client.post(reverse("ssh-key-create"), {"name": "laptop", "public_key": ssh_key()})
    body = client.get(reverse("reservation-new")).content.decode()
    assert "Saved SSH keys" in body and "laptop" in body


def test_the_reserve_form_offers_the_images_a_tenant_may_boot(console, world):
    body = console("t1_member").get(reverse("reservation-new")).content.decode()
    assert "Default for the offering" in body
    assert world.t1.objects[Image].name in body and world.t2.objects[Image].name not in body

"""
The image catalogue: staff publish public images, members register their tenant's own; a
reservation picks one that fits (its kind, its regions, the GPU's CUDA) and its instances boot it
with its login user -- or the default of their kind. In use, an image may be deprecated, not deleted.
"""

import pytest

from cloud.models import GPUModel, Image
from provisioning.drivers.simulated_devices import SimulatedDevice
from provisioning.models import Instance, Reservation
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import image, small_fleet

IMAGES = "/api/v1/images/"
URL = "/api/v1/reservations/"


def body(**extra):
    return {"name": "rocky", "kind": "bare_metal", "os": "rocky-9", "cuda_version": "12.4", "size_bytes": 2**30,
            "sha256": "b" * 64, "source_url": "https://images.example/rocky.img", "regions": ["us-east-1"],
            "login_user": "rocky", **extra}


def codes(response):
    return [(e["attr"], e["code"]) for e in response.json()["errors"]]


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


#
# The catalogue
#


def test_platform_admins_publish_members_register_their_tenants_own(world, fleet):
    public = world.client("platform_admin").post(IMAGES, body(public=True), format="json")
    assert public.status_code == 201, public.json()
    assert public.json()["is_public"] is True and public.json()["state"] == "active"
    own = world.client("t1_member").post(IMAGES, body(name="ours"), format="json")
    assert own.status_code == 201 and own.json()["is_public"] is False
    assert Image.objects.get(pk=own.json()["id"]).tenant == world.t1.tenant
    assert world.client("t1_member").post(IMAGES, body(name="x", public=True), format="json").status_code == 403
    assert world.client("t1_viewer").post(IMAGES, body(name="y"), format="json").status_code == 403


def test_a_wrong_image_is_a_400_naming_the_field_and_a_taken_name_a_409(world, fleet):
    client = world.client("t1_member")
    assert codes(client.post(IMAGES, body(sha256="nothex"), format="json")) == [("sha256", "invalid")]
    assert codes(client.post(IMAGES, body(cuda_version="twelve"), format="json")) == [("cuda_version", "invalid")]
    assert codes(client.post(IMAGES, body(regions=["mars-1"]), format="json"))[0][0] == "regions"
    assert codes(client.post(IMAGES, body(kind="floppy"), format="json"))[0][0] == "kind"
    assert client.post(IMAGES, body(), format="json").status_code == 201
    taken = client.post(IMAGES, body(), format="json")
    assert taken.status_code == 409 and codes(taken) == [(None, "image_exists")]
    assert world.client("t2_member").post(IMAGES, body(), format="json").status_code == 201  # their own namespace


def test_a_tenant_sees_the_public_images_and_its_own_never_anothers(world):
    public = image(name="public-one")
    ours = world.t1.objects[Image]
    theirs = world.t2.objects[Image]
    listed = {i["id"] for i in world.client("t1_member").get(IMAGES, {"page_size": 200}).json()["results"]}
    assert {str(public.pk), str(ours.pk)} <= listed and str(theirs.pk) not in listed
    assert world.client("t1_member").get(f"{IMAGES}{theirs.pk}/").status_code == 404
    assert world.client("t1_member").delete(f"{IMAGES}{public.pk}/").status_code == 404  # not theirs to change


#
# Reservations
#


def reserve(world, **extra):
    payload = {"name": "job", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"],
               "duration_hours": 2, "nodes": 1, "ssh_public_key": SSH_KEY, **extra}
    return world.client("t1_member").post(URL, payload, format="json")


def booted(pk) -> tuple[str, str]:
    instance = Instance.objects.get(reservation_id=pk)
    disk = SimulatedDevice.objects.get(key=f"disk:{instance.node.hostname}").state
    return disk["image"], instance.ssh_user


def test_the_instances_boot_the_image_named_with_its_login_user(world, fleet, steps):
    rocky = image(name="rocky", login_user="rocky", os="rocky-9")
    response = reserve(world, image=str(rocky.pk))
    assert response.status_code == 201, response.json()
    assert response.json()["image"] == str(rocky.pk)
    steps.run()
    assert reservation(response.json()["id"]).state == "active"
    assert booted(response.json()["id"]) == (rocky.source_url, "rocky")


def test_without_an_image_the_default_of_the_kind_is_booted(world, fleet, steps):
    default = image(name="default-server", is_default=True, login_user="admin")
    image(name="default-vm", kind="vm", is_default=True)
    response = reserve(world)
    assert response.status_code == 201 and response.json()["image"] is None
    steps.run()
    assert booted(response.json()["id"]) == (default.source_url, "admin")


@pytest.mark.parametrize("make, code", [
    (lambda w: image(kind="vm"), "image_kind"),
    (lambda w: image(regions=["eu-west-1"]), "image_region"),
    (lambda w: image(state="deprecated"), "image_unavailable"),
    (lambda w: image(cuda_version="13.1"), "image_cuda"),
])
def test_an_image_the_reservation_cannot_boot_is_a_400_naming_image(world, fleet, make, code):
    GPUModel.objects.filter(slug="h100-80gb-sxm").update(max_cuda_version="12.8")
    before = Reservation.objects.count()
    response = reserve(world, image=str(make(world).pk))
    assert response.status_code == 400, response.json()
    assert codes(response) == [("image", code)]
    assert Reservation.objects.count() == before


def test_another_tenants_image_is_a_400_that_says_nothing_of_it(world, fleet):
    response = reserve(world, image=str(world.t2.objects[Image].pk))
    assert response.status_code == 400 and codes(response)[0][0] == "image"
    assert "does not exist" in response.json()["errors"][0]["detail"]


def test_an_image_in_use_is_deprecated_not_deleted(world, fleet, steps):
    ours = world.t1.objects[Image]
    pk = reserve(world, image=str(ours.pk)).json()["id"]
    steps.run()
    client = world.client("t1_member")
    refused = client.delete(f"{IMAGES}{ours.pk}/")
    assert refused.status_code == 409 and codes(refused) == [(None, "image_in_use")]
    deprecated = client.post(f"{IMAGES}{ours.pk}/deprecate/")
    assert deprecated.status_code == 200 and deprecated.json()["state"] == "deprecated"
    assert codes(reserve(world, image=str(ours.pk))) == [("image", "image_unavailable")]  # no new ones
    assert world.client("t1_member").post(f"{URL}{pk}/release/").status_code == 200
    steps.run()
    assert client.delete(f"{IMAGES}{ours.pk}/").status_code == 204
    assert Image.objects.get(pk=ours.pk).state == "deleted"
    assert client.get(f"{IMAGES}{ours.pk}/").status_code == 404

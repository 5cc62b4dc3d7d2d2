from tenants.models import Membership


def test_world_has_two_tenants_and_personas(world):
    assert Membership.objects.filter(tenant=world.t1.tenant).count() == 4
    response = world.client("t1_member").get("/api/v1/me/")
    assert response.status_code == 200, response.content
    assert response.json()["acting_as"]["tenant"] == str(world.t1.tenant.pk)

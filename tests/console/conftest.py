"""Console test helpers: a browser-like client signed in as one of the world's personas."""

import pytest
from django.test import Client

from tests.world import TENANT_ROLES
from web.console import SESSION_TENANT


@pytest.fixture
def console(world):
    """``console("t1_viewer")``: a Django test client signed in as that persona, in its tenant."""

    def signed_in(persona: str) -> Client:
        client = Client()
        if persona == "anon":
            return client
        client.force_login(world.users[persona])
        if persona in TENANT_ROLES:
            session = client.session
            session[SESSION_TENANT] = world.side(TENANT_ROLES[persona][0]).tenant.slug
            session.save()
        return client

    return signed_in

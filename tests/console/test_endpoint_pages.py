"""
The console's endpoints pages: a member creates an endpoint and sees its replicas, the scaling
history and the utilization chart; bad input says why and keeps what was typed; another tenant
gets 404; viewers read without the forms.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cloud.models import GPUSampleRollup
from inference import replicas, scaling
from inference.models import Endpoint
from tests.inference.helpers import replica_gpus, sample, two_regions, whole_gpu_container

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(world, settings, tmp_path):
    settings.MERIDIAN_BALANCER_CONFIG = str(tmp_path / "haproxy.cfg")
    settings.MERIDIAN_ENDPOINT_PROBE = "simulated"
    two_regions()
    whole_gpu_container()


FORM = {"name": "chat", "gpu_model": "h100-80gb-sxm", "kind": "gpu", "fraction": "1", "time_slice_class": "",
        "regions": "us-east-1", "min_replicas": "1", "max_replicas": "3", "health_path": "/healthz"}


def test_a_member_creates_an_endpoint_and_follows_it(console, world, fleet, steps):
    client = console("t1_member")
    page = client.get("/endpoints/").content.decode()
    assert "No endpoint yet" in page and 'href="/endpoints/" aria-current="page"' in page
    made = client.post("/endpoints/new/", FORM, follow=True).content.decode()
    endpoint = Endpoint.objects.get()
    assert "is starting its first replicas" in made and f"chat--{endpoint.tenant.slug}" in made
    replicas.converge(endpoint.pk)
    steps.run()
    replicas.converge(endpoint.pk)
    sample(replica_gpus(endpoint), 90)
    scaling.autoscale(endpoint.pk)
    for gpu in replica_gpus(endpoint):
        GPUSampleRollup.objects.create(gpu_id=gpu, period="1m", bucket=timezone.now() - timedelta(minutes=1),
                                       samples=6, utilization_samples=6, utilization_sum=540)
    page = client.get(f"/endpoints/{endpoint.pk}/").content.decode()
    assert "scale out" in page and "over the 70% target" in page and "90.0 % over 1 serving" in page
    assert "serving" in page and "<svg" in page
    page = client.post(f"/endpoints/{endpoint.pk}/scale/", {"min_replicas": "2", "max_replicas": "5",
                                                            "target_utilization": "60"}, follow=True).content.decode()
    assert "between 2 and 5 replicas at 60 %" in page
    assert console("t2_owner").get(f"/endpoints/{endpoint.pk}/").status_code == 404
    assert console("t2_owner").post(f"/endpoints/{endpoint.pk}/delete/").status_code == 404
    viewer = console("t1_viewer").get(f"/endpoints/{endpoint.pk}/").content.decode()
    assert "Delete chat" not in viewer and "scale out" in viewer
    gone = client.post(f"/endpoints/{endpoint.pk}/delete/", follow=True).content.decode()
    assert "its replicas drain and go" in gone


def test_bad_input_says_why_and_keeps_what_was_typed(console, world, fleet):
    page = console("t1_member").post("/endpoints/new/", {**FORM, "min_replicas": "5"}).content.decode()
    assert "is more than max_replicas" in page and 'value="chat"' in page
    page = console("t1_member").post("/endpoints/new/", {**FORM, "kind": "mig", "time_slice_class": "batch"}).content
    assert b"A time-slice class goes with a time_slice share" in page
    page = console("t1_member").post("/endpoints/new/", {**FORM, "health_path": "https://x.example/h"}).content
    assert b"not a URL of another host" in page
    assert not Endpoint.objects.exists()

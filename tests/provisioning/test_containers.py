"""
GPU containers: the manifests (checked by the kubernetes client's own models), and the
Kubernetes driver speaking the official client over HTTP to a local stand-in of the API server
(tests/provisioning/kube_server.py): what it creates, that every call is safe to repeat, and how
refusals, outages and a bad token come back.
"""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client

from provisioning.drivers import DriverError, Target, drivers_for
from provisioning.drivers.kubernetes_pods import KubernetesContainers
from provisioning.drivers.pods import Limits, pod_phase, pod_spec
from tests.provisioning.kube_server import KubeAPI, serve
from tests.provisioning.pipeline import SSH_KEY as KEY

GPUS = [{"gpu_id": "gpu-a", "pci_bus_id": "00000000:18:00.0"}, {"gpu_id": "gpu-b", "pci_bus_id": "00000000:2a:00.0"}]
HOST = Target(node_id="1", hostname="gpu-node-07")


def _spec(**overrides):
    return pod_spec(**{"name": "pod-1", "tenant_id": "t1", "node_name": "gpu-node-07", "image": "img:1",
                       "devices": GPUS, "limits": Limits(gpus=2, cpu_millicores=28000, memory_mib=460_000),
                       "authorized_keys": KEY, "environment": {"WANDB_API_KEY": "secret-value"},
                       "labels": {"meridian.cloud/reservation": "r-1"}, "network": "ib-vpc",
                       "vf_guid": "02a1b2c3d4e5f601", **overrides})


#
# Manifests
#


def test_whole_gpus_cpu_and_memory_are_limited_and_guaranteed():
    pod = _spec().pod
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    limits = {"cpu": "28000m", "memory": "460000Mi", "nvidia.com/gpu": "2"}
    assert container["resources"] == {"limits": limits, "requests": limits}  # Guaranteed QoS
    assert spec["nodeName"] == "gpu-node-07" and pod["metadata"]["namespace"] == "tenant-t1"
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False}
    assert pod["metadata"]["labels"]["meridian.cloud/tenant"] == "t1"


def test_a_slot_asks_for_a_gpu_share_with_its_memory_cap():
    pod = _spec(devices=GPUS[:1], limits=Limits(gpus=0, gpu_memory_cap_mib=8192, cpu_millicores=1000,
                                                 memory_mib=4096)).pod
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "1000m", "memory": "4096Mi", "nvidia.com/gpu.shared": "1"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["meridian.cloud/gpus"] == "gpu-a"
    assert annotations["meridian.cloud/gpu-memory-cap-mib"] == "8192"


def test_a_pod_without_gpus_or_a_slot_is_refused():
    with pytest.raises(ValueError):
        _spec(limits=Limits(gpus=0, cpu_millicores=1000, memory_mib=4096))


def test_keys_and_environment_live_in_the_secret_not_the_pod_spec():
    spec = _spec()
    assert spec.secret["stringData"] == {"authorized_keys": KEY + "\n", "env.WANDB_API_KEY": "secret-value"}
    assert "secret-value" not in json.dumps(spec.pod) and KEY not in json.dumps(spec.pod)
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in spec.pod["spec"]["containers"][0]["env"]}
    assert env == {"SSH_PUBLIC_KEY": {"name": "pod-1-access", "key": "authorized_keys"},
                   "WANDB_API_KEY": {"name": "pod-1-access", "key": "env.WANDB_API_KEY"}}
    (volume,) = spec.pod["spec"]["volumes"]
    assert volume["secret"] == {"secretName": "pod-1-access", "defaultMode": 0o400,
                                "items": [{"key": "authorized_keys", "path": "authorized_keys"}]}


def test_the_pod_joins_the_tenant_network_with_its_virtual_function():
    spec = _spec()
    (attachment,) = json.loads(spec.pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"])
    assert attachment == {"name": "ib-vpc", "interface": "ib0", "cni-args": {"guid": "02:a1:b2:c3:d4:e5:f6:01"}}
    assert "k8s.v1.cni.cncf.io/networks" not in _spec(network="").pod["metadata"]["annotations"]
    policy = spec.network_policy["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"from": [{"podSelector": {}}]}, {"ports": [{"port": 22, "protocol": "TCP"}]}]
    assert spec.namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_manifests_round_trip_through_the_client_models():
    api, spec = client.ApiClient(), _spec()
    for manifest, kind in ((spec.pod, "V1Pod"), (spec.secret, "V1Secret"), (spec.namespace, "V1Namespace"),
                           (spec.network_policy, "V1NetworkPolicy")):
        model = api._ApiClient__deserialize(manifest, kind)
        assert api.sanitize_for_serialization(model) == manifest


def test_client_models_refuse_a_container_without_a_name():
    """kubernetes 36's models check required fields, which is what the manifests rely on."""
    nameless = _spec().pod
    del nameless["spec"]["containers"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        client.ApiClient()._ApiClient__deserialize(nameless, "V1Pod")


@pytest.mark.parametrize(("status", "expected"), [
    ({"phase": "Running"}, "running"),
    ({}, "starting"),
    ({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]},
     "starting"),
    ({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff",
                                                                        "message": "not found"}}}]}, "failed"),
    ({"phase": "Failed", "reason": "Evicted"}, "failed"),
])
def test_pod_phase_reads_what_the_kubelet_reports(status, expected):
    assert pod_phase({"status": status})[0] == expected


#
# The driver against the API
#


@pytest.fixture
def cluster(settings):
    api = KubeAPI()
    server, url = serve(api)
    settings.MERIDIAN_KUBERNETES = {"default": {"url": url, "token": "sa-token"}}
    yield api
    server.shutdown()
    server.server_close()


def test_apply_creates_namespace_policy_secret_and_pod(cluster):
    pods = KubernetesContainers(region="us-east-1")
    assert pods.pod(HOST, "tenant-t1", "pod-1") is None
    pods.apply(HOST, _spec())
    assert cluster.names("namespaces") == ["tenant-t1"]
    assert cluster.names("networkpolicies") == ["tenant-t1/tenant-isolation"]
    assert cluster.names("secrets") == ["tenant-t1/pod-1-access"]
    assert cluster.names("pods") == ["tenant-t1/pod-1"]
    secret = cluster.get("secrets", "tenant-t1", "pod-1-access")
    assert base64.b64decode(secret["data"]["authorized_keys"]).decode() == KEY + "\n"
    pod = pods.pod(HOST, "tenant-t1", "pod-1")
    assert pod["metadata"]["uid"] and pod["spec"]["nodeName"] == "gpu-node-07"
    assert pod_phase(pod)[0] == "starting"
    cluster.start("tenant-t1", "pod-1")
    assert pod_phase(pods.pod(HOST, "tenant-t1", "pod-1"))[0] == "running"
    sent = [(method, path) for method, path, _ in cluster.requests if method == "POST"]
    assert sent == [("POST", "/api/v1/namespaces"),
                    ("POST", "/apis/networking.k8s.io/v1/namespaces/tenant-t1/networkpolicies"),
                    ("POST", "/api/v1/namespaces/tenant-t1/secrets"), ("POST", "/api/v1/namespaces/tenant-t1/pods")]


def test_apply_again_finishes_what_a_dead_worker_left_and_rewrites_the_keys(cluster):
    pods = KubernetesContainers(region="us-east-1")
    pods.apply(HOST, _spec())
    uid = pods.pod(HOST, "tenant-t1", "pod-1")["metadata"]["uid"]
    cluster.objects.pop(("pods", "tenant-t1", "pod-1"))  # the worker died before the pod was created
    pods.apply(HOST, _spec(authorized_keys="ssh-ed25519 AAAAnewkey", name="pod-1"))
    assert cluster.names("pods") == ["tenant-t1/pod-1"]
    assert pods.pod(HOST, "tenant-t1", "pod-1")["metadata"]["uid"] != uid
    secret = cluster.get("secrets", "tenant-t1", "pod-1-access")
    assert base64.b64decode(secret["data"]["authorized_keys"]).decode() == "ssh-ed25519 AAAAnewkey\n"
    pods.apply(HOST, _spec())  # everything there: 409s, nothing changes
    assert cluster.names("pods") == ["tenant-t1/pod-1"]


def test_delete_takes_the_pod_and_its_secret_and_is_safe_to_repeat(cluster):
    pods = KubernetesContainers(region="us-east-1")
    pods.apply(HOST, _spec())
    pods.apply(HOST, _spec(name="pod-2"))
    pods.delete(HOST, "tenant-t1", "pod-1")
    pods.delete(HOST, "tenant-t1", "pod-1")
    assert cluster.names("pods") == ["tenant-t1/pod-2"]
    assert cluster.names("secrets") == ["tenant-t1/pod-2-access"]
    assert cluster.names("namespaces") == ["tenant-t1"]  # the tenant's other pod lives there
    deleted = [path for method, path, _ in cluster.requests if method == "DELETE"]
    assert deleted[:2] == ["/api/v1/namespaces/tenant-t1/pods/pod-1",
                           "/api/v1/namespaces/tenant-t1/secrets/pod-1-access"]


def test_a_retried_removal_deletes_the_secret_a_dead_worker_left(cluster):
    from types import SimpleNamespace

    from provisioning.lifecycle.guest_steps import _remove_pod

    pods = KubernetesContainers(region="us-east-1")
    pods.apply(HOST, _spec())
    cluster.objects.pop(("pods", "tenant-t1", "pod-1"))  # the worker died after the pod, before its secret
    _remove_pod(pods, "tenant-t1", SimpleNamespace(name="pod-1"), HOST)
    assert cluster.names("secrets") == [] and cluster.names("pods") == []


def test_a_refused_token_fails_for_good_and_says_so(cluster, settings):
    settings.MERIDIAN_KUBERNETES = {"default": {**settings.MERIDIAN_KUBERNETES["default"], "token": "wrong"}}
    with pytest.raises(DriverError) as caught:
        KubernetesContainers(region="us-east-1").apply(HOST, _spec())
    assert caught.value.transient is False and "401" in str(caught.value)
    assert cluster.names("pods") == []


def test_server_errors_are_transient_and_a_rejected_manifest_is_not(cluster):
    pods = KubernetesContainers(region="us-east-1")
    cluster.fail_next = [503]
    with pytest.raises(DriverError) as caught:
        pods.apply(HOST, _spec())
    assert caught.value.transient is True
    with pytest.raises(DriverError) as caught:
        pods.apply(HOST, _spec(image=""))
    assert caught.value.transient is False and "spec.containers[0].image: Required value" in str(caught.value)


def test_an_answer_that_is_not_json_is_a_driver_error(settings):
    import http.server
    import threading

    class NotKubernetes(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>proxy login</html>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotKubernetes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        settings.MERIDIAN_KUBERNETES = {"default": {"url": url, "token": "t"}}
        with pytest.raises(DriverError, match="not JSON"):
            KubernetesContainers(region="us-east-1").pod(HOST, "tenant-t1", "pod-1")
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_api_is_transient(settings):
    settings.MERIDIAN_KUBERNETES = {"default": {"url": "http://127.0.0.1:9", "token": "t"}}
    with pytest.raises(DriverError) as caught:
        KubernetesContainers(region="us-east-1").pod(HOST, "tenant-t1", "pod-1")
    assert caught.value.transient is True and "Cannot reach the Kubernetes API" in str(caught.value)


def test_no_cluster_configured_says_what_to_set(settings):
    settings.MERIDIAN_KUBERNETES = {}
    with pytest.raises(DriverError, match="set MERIDIAN_KUBERNETES") as caught:
        KubernetesContainers(region="eu-west-1").pod(HOST, "tenant-t1", "pod-1")
    assert caught.value.transient is False


def test_a_region_gets_its_own_cluster(settings):
    settings.MERIDIAN_DRIVERS = {"default": {"container": "kubernetes"}}
    east, west = drivers_for("us-east-1").container, drivers_for("eu-west-1").container
    assert isinstance(east, KubernetesContainers) and (east.region, west.region) == ("us-east-1", "eu-west-1")


#
# A container reservation through the Kubernetes driver
#


@pytest.fixture
def fleet(world):
    from provisioning.models import Reservation
    from tests.world import small_fleet

    Reservation.objects.all().delete()  # the world's own queued work would compete
    return small_fleet(4)


def _until_pulling(steps):
    """Run tasks until the pod is made and its step waits for it to run."""
    for _ in range(20):
        steps.run(limit=1, settle=False)
        if ("provision", "apply_pod", "waiting") in steps.ran:
            return
    raise AssertionError(f"apply_pod never waited: {steps.ran}")


def test_a_container_runs_through_the_api_and_leaves_nothing(world, fleet, steps, cluster, settings):
    from provisioning.models import Instance, Reservation, VirtualFunction
    from tests.provisioning.factories import offering

    settings.MERIDIAN_DRIVERS = {"default": {"container": "kubernetes"}}
    chosen = offering("container", 1)
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "train", "offering": chosen.slug, "regions": ["us-east-1"], "duration_hours": 2, "gpus": 1,
        "ssh_public_key": KEY, "environment": {"WANDB_API_KEY": "secret-value"}}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["environment"] == ["WANDB_API_KEY"]  # names only
    pk = response.json()["id"]
    _until_pulling(steps)
    assert Reservation.objects.get(pk=pk).state == "provisioning"  # the pod is pulling its image
    instance = Instance.objects.get(reservation_id=pk)
    namespace = f"tenant-{instance.reservation.tenant_id}"
    pod = cluster.get("pods", namespace, instance.name)
    assert pod["spec"]["nodeName"] == instance.node.hostname
    vf = VirtualFunction.objects.get(instance=instance)  # handed out for the pod, then joined to the VPC
    attachment = json.loads(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"])[0]
    assert attachment["cni-args"]["guid"].replace(":", "") == vf.guid
    secret = cluster.get("secrets", namespace, f"{instance.name}-access")
    assert base64.b64decode(secret["data"]["env.WANDB_API_KEY"]).decode() == "secret-value"
    assert KEY in base64.b64decode(secret["data"]["authorized_keys"]).decode()

    cluster.start(namespace, instance.name)
    steps.run()
    assert Reservation.objects.get(pk=pk).state == "active"
    assert Instance.objects.get(pk=instance.pk).runtime_uid == pod["metadata"]["uid"]

    assert world.client("t1_member").post(f"/api/v1/reservations/{pk}/release/").status_code in (200, 202)
    steps.run()
    assert Reservation.objects.get(pk=pk).state == "released"
    assert cluster.names("pods") == [] and cluster.names("secrets") == []


def test_a_container_whose_image_cannot_be_pulled_fails_and_is_cleaned(world, fleet, steps, cluster, settings):
    from cloud.models import Node
    from provisioning.models import Instance, Reservation
    from tests.provisioning.factories import offering

    settings.MERIDIAN_DRIVERS = {"default": {"container": "kubernetes"}}
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "train", "offering": offering("container", 1).slug, "regions": ["us-east-1"],
        "duration_hours": 2, "gpus": 1, "ssh_public_key": KEY}, format="json")
    pk = response.json()["id"]
    _until_pulling(steps)
    instance = Instance.objects.get(reservation_id=pk)
    cluster.wait(f"tenant-{instance.reservation.tenant_id}", instance.name, "ImagePullBackOff",
                 'Back-off pulling image "nvcr.io/nvidia/pytorch:25.01-py3"')
    steps.run()
    reservation = Reservation.objects.get(pk=pk)
    assert "ImagePullBackOff" in reservation.state_reason and reservation.provision_failures == 1
    assert Node.objects.get(pk=instance.node_id).state == "in_service"  # not the host's fault
    assert Instance.objects.get(pk=instance.pk).state == "released"
    assert f"{instance.name}-access" not in json.dumps(cluster.names("secrets"))
    assert instance.name not in json.dumps(cluster.names("pods"))


@pytest.mark.parametrize(("environment", "message"), [
    ({"1BAD": "x"}, "is not a variable name"),
    ({"MERIDIAN_TOKEN": "x"}, "is set by Meridian"),
    ({f"V{i}": "x" for i in range(65)}, "no more than 64"),
    ({"BIG": "x" * 40_000}, "the limit is 32,768"),
])
def test_bad_environments_are_400_on_environment(world, fleet, environment, message):
    from tests.provisioning.factories import offering

    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "train", "offering": offering("container", 1).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "gpus": 1, "environment": environment}, format="json")
    assert response.status_code == 400, response.json()
    assert message in json.dumps(response.json())
    assert "environment" in json.dumps(response.json())


def test_environment_is_for_containers(world, fleet):
    from tests.provisioning.factories import offering

    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "train", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "nodes": 1, "environment": {"A": "b"}}, format="json")
    assert response.status_code == 400
    assert "use" in json.dumps(response.json()) or "user_data" in json.dumps(response.json())

"""
GPU containers through a real Kubernetes API server, with the official ``kubernetes`` client.

``settings.MERIDIAN_KUBERNETES`` names each region's cluster (``"default"`` and region slugs):
``{"url", "token", "ca_file", "verify_tls"}`` for a service account's bearer token, or
``{"kubeconfig", "context"}`` for a kubeconfig file. The service account needs create, get and
delete on namespaces, networkpolicies, secrets and pods (docs/provisioning.md, Containers).

Every call is safe to repeat: creating what exists already (409) counts as done, deleting what
is gone (404) too. Failures become ``DriverError``: transient for timeouts, 429 and 5xx; for good
for a refused token or a manifest the API rejects, with the API's own message.
"""

from __future__ import annotations

import json

import urllib3
from django.conf import settings
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from provisioning.drivers.base import ContainerDriver, DriverError, Target
from provisioning.drivers.pods import PodSpec

TIMEOUT = (5, 30)  # connect, read (seconds)


class KubernetesContainers(ContainerDriver):
    per_region = True

    def __init__(self, *, region: str = "default"):
        self.region = region
        self._client: tuple[str, client.ApiClient] | None = None

    def _api(self) -> client.ApiClient:
        """One client (and connection pool) per cluster settings: made again when they change."""
        clusters = settings.MERIDIAN_KUBERNETES
        chosen = clusters.get(self.region) or clusters.get("default")
        key = json.dumps(chosen, sort_keys=True)
        if self._client is None or self._client[0] != key:
            self._client = (key, client.ApiClient(self._configuration(chosen)))
        return self._client[1]

    def _configuration(self, chosen: dict | None) -> client.Configuration:
        if not chosen:
            raise DriverError(f"No Kubernetes cluster is configured for region {self.region}: set "
                              "MERIDIAN_KUBERNETES (docs/configuration.md).", transient=False)
        configuration = client.Configuration()
        if chosen.get("kubeconfig"):
            try:
                kube_config.load_kube_config(config_file=chosen["kubeconfig"], context=chosen.get("context"),
                                             client_configuration=configuration)
            except (OSError, kube_config.ConfigException) as exc:
                raise DriverError(f"The kubeconfig for region {self.region} cannot be used: {exc}.",
                                  transient=False) from exc
            return configuration
        if not chosen.get("url"):
            raise DriverError(f"MERIDIAN_KUBERNETES for region {self.region} needs 'url' (and 'token') or "
                              "'kubeconfig'.", transient=False)
        configuration.host = chosen["url"].rstrip("/")
        if chosen.get("token"):
            configuration.api_key = {"BearerToken": chosen["token"]}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        configuration.verify_ssl = chosen.get("verify_tls", True)
        configuration.ssl_ca_cert = chosen.get("ca_file") or None
        configuration.retries = False  # a retried step is the retry
        return configuration

    def _call(self, target: Target, what: str, call, *, absent_ok: bool = False, exists_ok: bool = False):
        """One API call, its JSON answer as a dict; 404 (``absent_ok``) gives None, 409 (``exists_ok``) too."""
        try:
            answer = call(_preload_content=False, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if (exc.status == 404 and absent_ok) or (exc.status == 409 and exists_ok):
                return None
            raise DriverError(f"Kubernetes refused to {what} for {target.hostname}: {_message(exc)}",
                              transient=exc.status in (0, 429) or exc.status >= 500) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise DriverError(f"Cannot reach the Kubernetes API of region {self.region} to {what}: {exc}.") from exc
        try:
            return json.loads(answer.data or b"{}")
        except ValueError as exc:  # a proxy's error page in front of the API, say
            raise DriverError(f"The Kubernetes API of region {self.region} answered {what} with something that is "
                              "not JSON; check MERIDIAN_KUBERNETES points at the API server.") from exc

    def pod(self, target, namespace, name):
        core = client.CoreV1Api(self._api())
        return self._call(target, f"read pod {namespace}/{name}",
                          lambda **kw: core.read_namespaced_pod(name, namespace, **kw), absent_ok=True)

    def apply(self, target, spec: PodSpec):
        core, networking = client.CoreV1Api(self._api()), client.NetworkingV1Api(self._api())
        namespace = spec.namespace_name
        self._call(target, f"create namespace {namespace}",
                   lambda **kw: core.create_namespace(spec.namespace, **kw), exists_ok=True)
        self._call(target, f"create the network policy of {namespace}",
                   lambda **kw: networking.create_namespaced_network_policy(namespace, spec.network_policy, **kw),
                   exists_ok=True)
        secret = spec.secret["metadata"]["name"]
        # The keys and environment as they are now: a retry after a key was removed writes it out.
        if self._call(target, f"create secret {namespace}/{secret}",
                      lambda **kw: core.create_namespaced_secret(namespace, spec.secret, **kw),
                      exists_ok=True) is None:
            self._call(target, f"replace secret {namespace}/{secret}",
                       lambda **kw: core.replace_namespaced_secret(secret, namespace, spec.secret, **kw))
        self._call(target, f"create pod {namespace}/{spec.name}",
                   lambda **kw: core.create_namespaced_pod(namespace, spec.pod, **kw), exists_ok=True)

    def delete(self, target, namespace, name):
        core = client.CoreV1Api(self._api())
        self._call(target, f"delete pod {namespace}/{name}",
                   lambda **kw: core.delete_namespaced_pod(name, namespace, grace_period_seconds=30, **kw),
                   absent_ok=True)
        self._call(target, f"delete secret {namespace}/{name}-access",
                   lambda **kw: core.delete_namespaced_secret(f"{name}-access", namespace, **kw), absent_ok=True)


def _message(exc: ApiException) -> str:
    """The API's own words (a Status object's message), else the HTTP reason."""
    try:
        status = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        status = {}
    return f"{exc.status} {status.get('message') or exc.reason or 'no answer'}".strip()

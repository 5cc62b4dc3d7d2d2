"""
The node API the agents call (``/api/agent/v1/``): plain JSON views, each request signed with the
node's key (operations.node_api.agents.authenticate). Not part of the tenant API: no user, no
tenant, no session -- a node, speaking for itself only.
"""

from __future__ import annotations

import json
import uuid

from django.conf import settings
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import APIException

from core.middleware import error_body
from operations.node_api import agents as node_agents
from operations.node_api import liveness
from provisioning.agent.signing import HEADER_NONCE
from provisioning.agents import commands as agent_commands


def _signed(handler, turn: bool = False, ping: bool = False):
    """
    Authenticate the node, parse the JSON body, and answer errors in the API's one shape. A
    ``turn`` handler (the heartbeat) is given what authenticate read for it as ``read``; a
    ``ping`` handler is given the request's nonce unspent, as ``nonce`` (it refuses copies itself).
    """

    @csrf_exempt
    def view(request, **kwargs):
        try:
            node, read = node_agents.authenticate(
                method=request.method, path=request.path, headers=request.headers, body=request.body, turn=turn,
                spend=not ping,
            )
            payload = json.loads(request.body) if request.body else {}
            if not isinstance(payload, dict):
                raise ValueError("the body must be a JSON object")
            if turn:
                kwargs["read"] = read
            if ping:
                kwargs["nonce"] = request.headers[HEADER_NONCE]
            return JsonResponse(handler(node, payload, **kwargs))
        except APIException as exc:
            code = exc.get_codes() if isinstance(exc.get_codes(), str) else "invalid"
            return JsonResponse(error_body("client_error", code, str(exc.detail)), status=exc.status_code)
        except KeyError as exc:
            return JsonResponse(
                error_body("validation_error", "required", f"The body needs the field {exc}."), status=400
            )
        except ValueError as exc:  # JSON that does not parse, or a field of the wrong shape (our messages)
            return JsonResponse(error_body("validation_error", "invalid", f"Bad request body: {exc}."), status=400)
        except TypeError:
            return JsonResponse(
                error_body("validation_error", "invalid", "A field of the body has the wrong type."), status=400
            )

    return view


def heartbeat(node, payload, read=None):
    """
    The agent's turn: its inventory (``gpus``), and from current agents a sample per GPU
    (``samples``) and its InfiniBand ports (``ports``), checked and stored by cloud.telemetry.
    An older agent that sends only ``gpus`` is still heard. The answer carries the desired state
    (the agent pulls it, node_agents.agent_turn): each GPU's isolation policy with its
    version, the policy itself only when it differs from the one the agent holds
    (``policy_version``, the version it was given last; an older agent sends none and gets the
    policy every time), and whether commands wait for it.
    """
    gpus = payload["gpus"]
    if not isinstance(gpus, list) or not all(isinstance(g, dict) and isinstance(g.get("uuid"), str) for g in gpus):
        raise ValueError("gpus must be a list of objects with a uuid")
    samples, ports, held = payload.get("samples"), payload.get("ports"), payload.get("policy_version")
    if samples is not None and not isinstance(samples, list):
        raise ValueError("samples must be a list of objects, one per GPU")
    if ports is not None and not isinstance(ports, list):
        raise ValueError("ports must be a list of objects with a guid and a link")
    if held is not None and not (isinstance(held, str) and len(held) <= 64):
        raise ValueError("policy_version must be the version string of the policy the agent holds")
    answer = node_agents.agent_turn(
        node=node,
        agent_version=str(payload.get("agent_version", "")),
        gpus=gpus,
        samples=samples,
        ports=ports,
        held=held,
        read=read,
    )
    # How often to ping between turns (0: no pings; operations.node_api.liveness).
    liveness_s = settings.MERIDIAN_LIVENESS_SECONDS
    return {"ok": True, "interval_s": settings.MERIDIAN_AGENT_INTERVAL, "liveness_s": liveness_s, **answer}


def alive(node, payload, nonce):
    """
    A liveness ping (operations.node_api.liveness): ``run``, ``seq``, ``sent_at`` (the node's Unix
    time), and the agent's view of its pings before it, ``rtt_ms`` and ``failed``; ``start`` begins
    a run, ``stop`` ends one. The answer says how often to ping (0: stop pinging).
    """
    liveness.alive(node=node, ping=liveness.ping_parse(payload), nonce=nonce)
    return {"ok": True, "liveness_s": settings.MERIDIAN_LIVENESS_SECONDS}


def violations(node, payload):
    found = payload["violations"]
    if (
        not isinstance(found, list)
        or len(found) > 256
        or not all(
            isinstance(v, dict)
            and isinstance(v.get("index"), int)
            and isinstance(v.get("kind"), str)
            and isinstance(v.get("action"), str)
            and isinstance(v.get("detail"), str)
            for v in found
        )
    ):
        raise ValueError("violations must be a list of objects with index, kind, action and detail")
    return {"recorded": node_agents.violations_report(node=node, violations=found)}


def commands(node, payload):
    return {
        "commands": [
            {"id": str(c.pk), "kind": c.kind, "payload": c.payload} for c in agent_commands.commands_take(node=node)
        ]
    }


def result(node, payload, command_id: uuid.UUID):
    command = node_agents.command_answered(node=node, command_id=command_id, ok=bool(payload["ok"]), result=payload)
    return {"state": command.state}


urlpatterns = [
    path("heartbeat/", require_http_methods(["POST"])(_signed(heartbeat, turn=True)), name="agent-heartbeat"),
    path("alive/", require_http_methods(["POST"])(_signed(alive, ping=True)), name="agent-alive"),
    path("commands/", require_http_methods(["GET"])(_signed(commands)), name="agent-commands"),
    path("violations/", require_http_methods(["POST"])(_signed(violations)), name="agent-violations"),
    path(
        "commands/<uuid:command_id>/result/",
        require_http_methods(["POST"])(_signed(result)),
        name="agent-command-result",
    ),
]

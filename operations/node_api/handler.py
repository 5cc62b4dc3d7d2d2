"""
The node API's own WSGI handler. Agents' heartbeats are most of the requests a fleet sends (1,280
nodes: 128 a second), and the browser middleware -- sessions, CSRF, CSP, messages, htmx, login
lockouts, static files -- has nothing to do for them but cost about a tenth of each. Requests
under NODE_API_PREFIX go through MERIDIAN_NODE_API_MIDDLEWARE (metrics, request id, body limit,
security, allowed hosts) and are resolved against a URLconf holding the node API only
(``operations.node_api.urls``), so this handler can serve nothing else; every other request takes
the full chain (``config.wsgi``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, MiddlewareNotUsed
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.urls import get_resolver
from django.utils.module_loading import import_string

NODE_API_PREFIX = "/api/agent/"


class NodeAPIHandler(WSGIHandler):
    urlconf = "operations.node_api.urls"

    def load_middleware(self, is_async=False):
        """As BaseHandler.load_middleware builds a synchronous chain, from MERIDIAN_NODE_API_MIDDLEWARE."""
        self._view_middleware, self._template_response_middleware, self._exception_middleware = [], [], []
        handler = convert_exception_to_response(self._get_response)
        for path in reversed(settings.MERIDIAN_NODE_API_MIDDLEWARE):
            factory = import_string(path)
            if not getattr(factory, "sync_capable", True):  # this chain is synchronous: no adapting here
                raise ImproperlyConfigured(f"{path} cannot run synchronously; the node API's chain is synchronous.")
            try:
                middleware = factory(handler)
            except MiddlewareNotUsed:
                continue
            if middleware is None:
                raise ImproperlyConfigured(f"Middleware factory {path} returned None.")
            if hasattr(middleware, "process_view"):
                self._view_middleware.insert(0, middleware.process_view)
            if hasattr(middleware, "process_template_response"):
                self._template_response_middleware.append(middleware.process_template_response)
            if hasattr(middleware, "process_exception"):
                self._exception_middleware.append(middleware.process_exception)
            handler = convert_exception_to_response(middleware)
        self._middleware_chain = handler

    def resolve_request(self, request):
        """
        Against the node API's URLs only. The thread's URLconf stays the project's (no
        ``request.urlconf``): what a view does -- failure detection telling tenants, with links to
        their reservations -- reverses the project's URLs.
        """
        match = get_resolver(self.urlconf).resolve(request.path_info)
        request.resolver_match = match
        return match


def split_node_api(application, node_api):
    """One WSGI application: the node API's paths to ``node_api``, everything else to ``application``."""

    def dispatch(environ, start_response):
        if environ.get("PATH_INFO", "").startswith(NODE_API_PREFIX):
            return node_api(environ, start_response)
        return application(environ, start_response)

    return dispatch

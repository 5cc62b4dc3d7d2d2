"""
WSGI entry point (gunicorn config.wsgi). The node API (/api/agent/) is served by a handler of its
own with a short middleware chain (operations.node_api.handler); everything else by Django's, as configured.
A chunked request body is read whole first (core.middleware.chunked_bodies). Tracing, when asked
for (config.tracing), is set up before either handler builds its middleware chain.
"""

import os

from django.core.wsgi import get_wsgi_application

from config.tracing import setup as setup_tracing
from core.middleware import chunked_bodies
from operations.node_api.handler import NodeAPIHandler, split_node_api

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
setup_tracing("web")
# The handler after Django's setup; chunked bodies are read whole (under the body limit) for both.
application = chunked_bodies(split_node_api(get_wsgi_application(), NodeAPIHandler()))

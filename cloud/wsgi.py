"""
WSGI entry point (gunicorn cloud.wsgi). The node API (/api/agent/) is served by a handler of its
own with a short middleware chain (cloud.handlers); everything else by Django's, as configured.
A chunked request body is read whole first (cloud.middleware.chunked_bodies).
"""

import os

from django.core.wsgi import get_wsgi_application

from cloud.handlers import NodeAPIHandler, split_node_api
from cloud.middleware import chunked_bodies

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cloud.settings")
# The handler after Django's setup; chunked bodies are read whole (under the body limit) for both.
application = chunked_bodies(split_node_api(get_wsgi_application(), NodeAPIHandler()))

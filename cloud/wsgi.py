"""
WSGI entry point (gunicorn cloud.wsgi). The node API (/api/agent/) is served by a handler of its
own with a short middleware chain (cloud.handlers); everything else by Django's, as configured.
"""

import os

from django.core.wsgi import get_wsgi_application

from cloud.handlers import NodeAPIHandler, split_node_api

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cloud.settings")
application = split_node_api(get_wsgi_application(), NodeAPIHandler())  # the handler after Django's setup

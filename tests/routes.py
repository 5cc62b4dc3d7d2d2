"""Every route of /api/v1/, read from the URL configuration, for the walkers in the tests."""

from __future__ import annotations

from dataclasses import dataclass

from config.api_router import router, urlpatterns

SAFE = {"GET", "HEAD", "OPTIONS"}


@dataclass(frozen=True)
class Route:
    method: str
    name: str
    viewset: type | None
    action: str | None

    @property
    def key(self) -> tuple[str, str]:
        return self.method, self.name

    @property
    def is_detail(self) -> bool:
        return self.name.endswith("-detail") or (self.viewset is not None and not self.name.endswith("-list"))


def api_routes() -> list[Route]:
    """(method, URL name) of every API operation: router routes and the plain views beside them."""
    routes = []
    for _prefix, viewset, basename in router.registry:
        for route in router.get_routes(viewset):
            name = route.name.format(basename=basename)
            for method, action in route.mapping.items():
                if hasattr(viewset, action):
                    routes.append(Route(method.upper(), name, viewset, action))
    for pattern in urlpatterns:
        view_class = getattr(pattern.callback, "view_class", None)
        if view_class is None or getattr(pattern.callback, "actions", None):
            continue  # router routes (they carry their actions) were listed above
        for method in ("get", "post", "put", "patch", "delete"):
            if hasattr(view_class, method):
                routes.append(Route(method.upper(), pattern.name, None, None))
    return sorted(set(routes), key=lambda r: (r.name, r.method))

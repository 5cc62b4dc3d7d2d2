"""
The offerings API: the catalogue's offerings with their list prices, the prices that apply now
(the price book's, spot at the market), and per region how many units could start now.
"""

from django.utils import timezone

from cloud import services
from cloud.api import serializers as s
from cloud.api.views import CatalogueWriteMixin
from cloud.filtersets import OfferingFilterSet
from cloud.models import Offering
from cloud.pricing import prices_now
from provisioning.capacity import availability
from web.api.base import PlatformViewSet, ReadMixin


class OfferingViewSet(ReadMixin, CatalogueWriteMixin, PlatformViewSet):
    """Offerings with list prices and, per region, how many units could start now."""

    policy = "offerings"
    queryset = Offering.objects.select_related("gpu_model")
    serializer_class = s.OfferingSerializer
    filterset_class = OfferingFilterSet
    ordering_fields = ["slug", "price_per_gpu_hour", "kind"]
    ordering = ["slug"]
    create_service = services.offering_create
    update_service = services.offering_update
    update_kwarg = "offering"

    def get_serializer_context(self):
        return super().get_serializer_context() | {"availability": getattr(self, "_availability", {}),
                                                   "prices": getattr(self, "_prices", {})}

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        self._read_figures(list(page if page is not None else queryset))
        return page

    def get_object(self):
        obj = super().get_object()
        self._read_figures([obj])
        return obj

    def _read_figures(self, offerings) -> None:
        self._availability = availability(offerings)
        self._prices = prices_now(offerings, at=timezone.now())

"""django-filter FilterSets of the inventory and catalogue lists."""

import django_filters

from cloud.models import GPU, Node, Offering


class OfferingFilterSet(django_filters.FilterSet):
    gpu_model = django_filters.CharFilter(field_name="gpu_model__slug", max_length=50)

    class Meta:
        model = Offering
        fields = ["kind", "isolation_mode", "spot_available", "is_active", "gpu_model"]


class NodeFilterSet(django_filters.FilterSet):
    region = django_filters.CharFilter(field_name="region__slug", max_length=50)
    leaf = django_filters.CharFilter(field_name="leaf__name", max_length=100)
    hostname = django_filters.CharFilter(lookup_expr="icontains", max_length=253)

    class Meta:
        model = Node
        fields = ["region", "fabric", "leaf", "pool", "state", "health", "is_spare", "hostname"]


class GPUFilterSet(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="model__slug", max_length=50)
    region = django_filters.CharFilter(field_name="node__region__slug", max_length=50)

    class Meta:
        model = GPU
        fields = ["node", "model", "state", "health", "region"]

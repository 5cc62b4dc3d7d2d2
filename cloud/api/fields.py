"""Serializer fields for the catalogue: a catalogue row by slug, looked up through the per-process cache."""

from django.core.exceptions import ObjectDoesNotExist
from django.utils.encoding import smart_str
from rest_framework import serializers

from cloud.catalogue_cache import CATALOGUE
from web.api.base import QuerysetSharedOnCopy


class CatalogueSlugField(QuerysetSharedOnCopy, serializers.SlugRelatedField):
    """
    A catalogue row (offering, region) by slug, the lookup remembered per process while the
    catalogue is unchanged (cloud.catalogue_cache). ``asked`` names the queryset (its filters).
    """

    def __init__(self, *, asked: str, **kwargs):
        self.asked = asked
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            return super().to_internal_value(data)  # its own "invalid"
        try:
            return CATALOGUE.get(self.get_queryset(), self.slug_field, data, asked=self.asked)
        except ObjectDoesNotExist:
            self.fail("does_not_exist", slug_name=self.slug_field, value=smart_str(data))
        except (TypeError, ValueError):
            self.fail("invalid")

"""
The API's base classes: every view of /api/v1/ derives from one of them.

- ``PrincipalMixin`` resolves ``request.principal`` right after authentication.
- ``ScopedViewSet.get_queryset`` applies ``visible_to(principal, action)`` -- the one place
  scoping happens in the API; views never filter by tenant by hand.
- ``TenantScopedViewSet`` serves tenant-owned models; ``PlatformViewSet`` platform-owned ones.
- ``ScopedRelatedField`` accepts only objects the principal can see, so a payload cannot point
  at another tenant's team (it is "not found", like one that does not exist).
- ``StrictSerializerMixin`` refuses unknown and read-only fields instead of ignoring them;
  ``JSONNumberMixin`` (``StrictIntegerField``, ``StrictFloatField``) refuses "12" for a number.
- ``BoundedListField``/``BoundedDictField``: a list or mapping is refused on its length before
  any of its items is validated or looked up.
"""

from django.db import models
from rest_framework import mixins, serializers, viewsets
from rest_framework.permissions import SAFE_METHODS, IsAuthenticated
from rest_framework.views import APIView

from tenants.permissions import RolePolicy
from tenants.principals import principal_for_request
from tenants.scoping import CHANGE, VIEW

SLUG_PATTERN = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"
UUID_PATTERN = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"


def action_for(method: str) -> str:
    return VIEW if method in SAFE_METHODS else CHANGE


class PrincipalMixin:
    """Sets ``request.principal`` (None when anonymous) before permissions and throttles run."""

    def perform_authentication(self, request):
        request.user  # noqa: B018 -- forces DRF to authenticate now
        request.principal = principal_for_request(request)


class ReadMixin(mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """List and retrieve; writes are explicit methods that call services."""


class PrincipalAPIView(PrincipalMixin, APIView):
    """A plain API view that still knows its principal (``/me``)."""


class ScopedViewSet(PrincipalMixin, viewsets.GenericViewSet):
    """Base of every resource viewset: scoped queryset, role policy, UUID lookups."""

    policy: str = ""
    permission_classes = [IsAuthenticated, RolePolicy]
    lookup_value_regex = UUID_PATTERN

    def get_queryset(self):
        return super().get_queryset().visible_to(self.request.principal, action_for(self.request.method))

    def filter_queryset(self, queryset):
        # The query string's filters and ordering narrow lists; one object is found by its id in
        # the scoped queryset alone (building the filter form took a millisecond of every
        # retrieve and action). Scoping is get_queryset's, never a filter's.
        if self.detail:
            return queryset
        return super().filter_queryset(queryset)

    @property
    def principal(self):
        return self.request.principal


class TenantScopedViewSet(ScopedViewSet):
    """Viewset of a tenant-owned model: tenant B gets 404 on tenant A's objects."""


class PlatformViewSet(ScopedViewSet):
    """Viewset of a platform-owned model (inventory, catalogue)."""


class QuerysetSharedOnCopy:
    """
    A related field whose copies share its queryset. DRF copies a serializer's declared fields
    for every instance it makes (``Field.__deepcopy__`` makes each again from its arguments,
    deep-copied), and deep-copying a queryset copies its whole query: the four of a create's
    fields cost more than the rest of its validation. The queryset is never changed in place
    (``RelatedField.get_queryset`` clones it before every use), so it is shared as DRF shares
    validators: put in the copy's memo, DRF's own copying hands back the same object.
    """

    def __deepcopy__(self, memo):
        queryset = self._kwargs.get("queryset")
        if queryset is not None:
            memo[id(queryset)] = queryset
        return super().__deepcopy__(memo)


class ScopedRelatedField(QuerysetSharedOnCopy, serializers.PrimaryKeyRelatedField):
    """A related object by id, looked up only among the objects the principal can see."""

    def get_queryset(self):
        request = self.context["request"]
        return super().get_queryset().visible_to(getattr(request, "principal", None))


class JSONNumberMixin:
    """
    A number given as a JSON number: "8" (a string) or true is refused, not coerced, so every
    numeric field answers "12" the same way. (Exact decimals are answered as strings, so a
    DecimalField takes a string too.)
    """

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise serializers.ValidationError('Give a JSON number, like 12 (not "12" or true).', code="invalid")
        return super().to_internal_value(data)


class StrictIntegerField(JSONNumberMixin, serializers.IntegerField):
    """An integer given as a JSON number: "8" (a string), 8.5 or true are refused, not coerced."""


class StrictFloatField(JSONNumberMixin, serializers.FloatField):
    """A number given as a JSON number: "12" (a string) or true are refused, not coerced."""


class NumberChoiceField(JSONNumberMixin, serializers.ChoiceField):
    """One of a few numbers (the IB MTU), given as a JSON number."""


class BoundedListField(serializers.ListField):
    """
    A list whose length is checked before any of its items: DRF's ListField validates (and may
    look up) every item first and counts them after, so 60,000 region names were 60,000 lookups
    and as many errors. Every list a body can carry is one of these, with a ``max_length``.
    """

    def __init__(self, *, max_length: int, **kwargs):
        super().__init__(max_length=max_length, **kwargs)

    def to_internal_value(self, data):
        if isinstance(data, list):
            if len(data) > self.max_length:
                self.fail("max_length", max_length=self.max_length)
            if self.min_length is not None and len(data) < self.min_length:
                self.fail("min_length", min_length=self.min_length)
        return super().to_internal_value(data)


class BoundedDictField(serializers.DictField):
    """A mapping whose number of entries is checked before any of its values (see BoundedListField)."""

    default_error_messages = {"max_length": "Ensure this field has no more than {max_length} entries."}

    def __init__(self, *, max_length: int, **kwargs):
        self.max_length = max_length
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, dict) and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class StrictSerializerMixin:
    """Unknown fields and read-only fields in a payload are a 400, not silently dropped."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            errors = {}
            for name in data:
                field = self.fields.get(name)
                if field is None:
                    errors[name] = [serializers.ErrorDetail("This field is not accepted here.", code="unknown_field")]
                elif field.read_only:
                    errors[name] = [serializers.ErrorDetail("This field is read-only.", code="read_only")]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class StrictSerializer(StrictSerializerMixin, serializers.Serializer):
    pass


class StrictModelSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    # A model's integer and float columns take JSON numbers only, like the declared fields.
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        **dict.fromkeys([models.IntegerField, models.BigIntegerField, models.PositiveIntegerField,
                         models.PositiveSmallIntegerField, models.SmallIntegerField], StrictIntegerField),
        models.FloatField: StrictFloatField,
    }

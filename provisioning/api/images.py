"""
The image catalogue's API (``/api/v1/images/``): everyone reads the public images and their
tenant's own; platform admins publish public ones (and the default of each kind), members
register their tenant's; an image is deprecated (``POST .../deprecate/``) or deleted when nothing
live boots it.
"""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud.choices import OfferingKind
from cloud.models import Image, Region
from provisioning import images
from web.api.base import BoundedListField, ReadMixin, StrictIntegerField, StrictModelSerializer, TenantScopedViewSet


class ImageSerializer(StrictModelSerializer):
    regions = BoundedListField(child=serializers.SlugField(max_length=50), max_length=64, default=list,
                               help_text="Slugs of the regions that hold it.")
    size_bytes = StrictIntegerField(min_value=1, max_value=2**50)
    kind = serializers.ChoiceField(choices=OfferingKind.choices)
    public = serializers.BooleanField(default=False, write_only=True,
                                      help_text="Publish for every tenant (platform admins only).")
    is_public = serializers.SerializerMethodField()
    is_default = serializers.BooleanField(default=False, help_text="The default of its kind (public images).")

    class Meta:
        model = Image
        fields = ["id", "name", "kind", "os", "cuda_version", "driver_version", "architecture", "size_bytes", "sha256",
                  "source_url", "regions", "state", "login_user", "is_default", "public", "is_public", "created_at"]
        read_only_fields = ["id", "state", "created_at"]

    def get_is_public(self, image) -> bool:
        return image.tenant_id is None

    def validate_regions(self, slugs):
        known = set(Region.objects.filter(slug__in=slugs).values_list("slug", flat=True))
        unknown = [slug for slug in slugs if slug not in known]
        if unknown:
            raise serializers.ValidationError(f"No region {', '.join(unknown[:5])}.", code="does_not_exist")
        return list(dict.fromkeys(slugs))


class ImageViewSet(ReadMixin, TenantScopedViewSet):
    """Images instances boot: the public ones and your tenant's own."""

    policy = "images"
    queryset = Image.objects.all()
    serializer_class = ImageSerializer
    filterset_fields = ["kind", "state", "architecture"]
    ordering_fields = ["name", "created_at"]
    ordering = ["kind", "name"]

    @extend_schema(responses={201: ImageSerializer})
    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        image = images.image_register(actor=self.principal, **data.validated_data)
        return Response(self.get_serializer(image).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ImageSerializer)
    @action(detail=True, methods=["post"])
    def deprecate(self, request, pk=None):
        """No new reservation takes the image; what runs it goes on."""
        image = images.image_deprecate(actor=self.principal, image=self.get_object())
        return Response(self.get_serializer(image).data)

    def destroy(self, request, pk=None):
        """Delete the image: 409 while a live reservation boots it."""
        images.image_delete(actor=self.principal, image=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

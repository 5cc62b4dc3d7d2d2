"""Issue an API token from the command line: ``manage.py issue_token alice@acme.example --tenant acme``."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from core.errors import DomainError
from tenants.choices import PlatformRole, TenantRole, TokenScope
from tenants.models import Membership, User
from tenants.principals import load_team_roles
from tenants.scoping import Principal
from tenants.services import token_issue
from web.console import messages_of


class Command(BaseCommand):
    help = "Issue an API token for a user (in one of their tenants, or a platform token for staff)."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--tenant", help="Tenant slug; omit for a platform token (staff only).")
        parser.add_argument("--scope", choices=TokenScope.values,
                            help="read or read_write (the default; read for a viewer, whose tokens only read).")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--days", type=int, default=30,
                            help="Lifetime in days (0: no expiry); tokens it issues expire no later than it.")

    def handle(self, *args, email, tenant, scope, name, days, **options):
        user = User.objects.filter(email__iexact=email).first()
        if user is None:
            raise CommandError(f"No user {email}.")
        if tenant:
            membership = Membership.objects.filter(user=user, tenant__slug=tenant).select_related("tenant").first()
            if membership is None:
                raise CommandError(f"{email} is not a member of tenant '{tenant}'.")
            principal = Principal(user=user, tenant=membership.tenant, role=TenantRole(membership.role),
                                  team_roles=load_team_roles(user, membership.tenant_id))
            if scope is None and membership.role == TenantRole.VIEWER:
                scope = TokenScope.READ
        elif user.platform_role != PlatformRole.NONE:
            principal = Principal(user=user)
        else:
            raise CommandError("Give --tenant: only platform staff get platform tokens.")
        expires = timezone.now() + timedelta(days=days) if days else None
        try:
            issued = token_issue(actor=principal, name=name, scope=scope or TokenScope.READ_WRITE, expires_at=expires)
        except DomainError as exc:
            raise CommandError(" ".join(messages_of(exc.detail))) from None
        self.stdout.write(issued.secret)

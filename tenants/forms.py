"""
The console's tenancy forms: API tokens, teams, members and invitations. They parse what a
person types and offer only what the principal can see; the services decide the rest (who may
grant which role, the last owner, the token's maximum lifetime) and their refusals come back
onto the form through :func:`add_domain_error`.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator, RegexValidator
from django.utils import timezone

from tenants.choices import TeamRole, TenantRole, TokenScope
from tenants.models import Membership, Team, User
from tenants.scoping import Principal
from web.api.base import SLUG_PATTERN

SLUG_MESSAGE = "Use lower-case letters, digits and single hyphens (for example 'vision-lab')."


def grantable_roles(principal: Principal) -> list[tuple[str, str]]:
    """The tenant roles ``principal`` may hand out: up to their own (only owners make owners)."""
    return [(value, label) for value, label in TenantRole.choices if principal.has_role(TenantRole(value))]


class TeamChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, team: Team) -> str:
        return team.name


#
# API tokens
#


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. ci-pipeline or laptop.")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ, widget=forms.RadioSelect,
                              help_text="Its rights never exceed your role: a viewer's token only reads.")
    team = TeamChoiceField(queryset=Team.objects.none(), required=False, empty_label="All of my tenant",
                           help_text="Bind it to one team: it then acts for that team only.")
    # A lifetime is asked for, 90 days proposed: an emptied field is an error, never a token that lasts forever.
    expires_in_days = forms.IntegerField(min_value=1, initial=90, label="Expires in (days)")

    def __init__(self, *args, principal: Principal, **kwargs):
        super().__init__(*args, **kwargs)
        self.principal = principal
        teams = Team.objects.visible_to(principal).order_by("name")
        if not principal.sees_all_teams:
            teams = teams.filter(pk__in=principal.team_ids)  # a token binds only to a team of one's own
        self.fields["team"].queryset = teams
        if principal.tenant is None:
            del self.fields["team"]  # a platform token belongs to no tenant, so to no team
        elif not principal.has_role(TenantRole.MEMBER):
            self.fields["scope"].choices = [(TokenScope.READ, TokenScope.READ.label)]  # a viewer's tokens only read
        max_days = settings.MERIDIAN_TOKEN_MAX_TTL.days
        field = self.fields["expires_in_days"]
        field.validators.append(MaxValueValidator(max_days, f"A token may live at most {max_days} days."))
        field.widget.attrs.update({"min": 1, "max": max_days})
        field.error_messages["required"] = f"Give the token a lifetime: 1 to {max_days} days."
        field.help_text = f"1 to {max_days} days."

    def service_arguments(self) -> dict:
        """The cleaned form as ``token_issue`` takes it."""
        return {
            "name": self.cleaned_data["name"],
            "scope": self.cleaned_data["scope"],
            "team": self.cleaned_data.get("team"),
            "expires_at": timezone.now() + timedelta(days=self.cleaned_data["expires_in_days"]),
        }



#
# Teams, members and invitations
#


class TeamForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Shown in lists, e.g. Vision lab.")
    slug = forms.CharField(max_length=50, validators=[RegexValidator(SLUG_PATTERN, SLUG_MESSAGE)],
                           help_text="Its short handle in the API: lower-case letters, digits and hyphens.")


class MembershipRoleForm(forms.Form):
    """A member's new tenant role; whether the principal may grant it is the service's rule."""

    role = forms.ChoiceField(choices=TenantRole.choices, label="Tenant role")


class TeamMembershipRoleForm(forms.Form):
    role = forms.ChoiceField(choices=TeamRole.choices, label="Team role")


class TeamMembershipAddForm(forms.Form):
    """Add a member of the tenant (only those, by the scoped membership list) to a team."""

    user = forms.ModelChoiceField(queryset=User.objects.none(), label="Member", empty_label="Choose a member",
                                  error_messages={"invalid_choice": "Choose a member of this tenant."})
    role = forms.ChoiceField(choices=TeamRole.choices, initial=TeamRole.MEMBER, label="Team role")

    def __init__(self, *args, principal: Principal, **kwargs):
        super().__init__(*args, **kwargs)
        members = Membership.objects.visible_to(principal).values("user_id")
        self.fields["user"].queryset = User.objects.filter(pk__in=members).order_by("email")


class InvitationForm(forms.Form):
    email = forms.EmailField(max_length=254, label="E-mail",
                             help_text="Only this address can accept; a new address creates its account there.")
    role = forms.ChoiceField(choices=TenantRole.choices, initial=TenantRole.MEMBER, label="Tenant role")
    team = TeamChoiceField(queryset=Team.objects.none(), required=False, empty_label="No team",
                           help_text="Optionally, a team they join too.")
    team_role = forms.ChoiceField(choices=TeamRole.choices, initial=TeamRole.MEMBER, label="Team role")

    def __init__(self, *args, principal: Principal, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = grantable_roles(principal)
        self.fields["team"].queryset = Team.objects.visible_to(principal).order_by("name")
        self.fields["team"].error_messages["invalid_choice"] = "Choose one of the tenant's teams."


class SSHKeyForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="To recognise it, e.g. laptop or ci.")
    public_key = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                                 label="Public key", max_length=16_384,
                                 help_text="The one line of your .pub file, e.g. ssh-ed25519 AAAA… you@laptop.")
    shared = forms.BooleanField(required=False, label="Shared by the whole tenant",
                                help_text="Every member may put it on their instances.")

    def __init__(self, *args, principal: Principal, **kwargs):
        super().__init__(*args, **kwargs)
        if not (principal.is_platform or principal.has_role(TenantRole.ADMIN)):
            del self.fields["shared"]  # tenant admins and owners share keys

"""
The console's high-priority forms: a team's application, a platform reviewer's decision, and a
platform admin's application on a team's behalf. They parse what a person types; the services in
``provisioning.high_priority.services`` decide who may apply or review, the thresholds and the one pending
application per team, and their refusals come back through :func:`web.console.add_domain_error`.
"""

from __future__ import annotations

from django import forms

from provisioning.high_priority.services import DECISIONS, NOTE_REQUIRED
from tenants.models import HighPriorityApplication, Team

NOTE_MAX = HighPriorityApplication._meta.get_field("note").max_length
REVIEW_NOTE_MAX = HighPriorityApplication._meta.get_field("review_note").max_length
OVERRIDE_NOTE_MAX = HighPriorityApplication._meta.get_field("override_note").max_length


def note_field(*, max_length: int, label: str, help_text: str, required: bool = True) -> forms.CharField:
    return forms.CharField(
        max_length=max_length, required=required, label=label, help_text=help_text,
        widget=forms.Textarea(attrs={"rows": 3}), error_messages={"required": NOTE_REQUIRED},
    )


class ApplyForm(forms.Form):
    """A team's application: why it needs high priority (its record is frozen in by the service)."""

    note = note_field(max_length=NOTE_MAX, label="Why the team needs high priority",
                      help_text="Shown to the platform reviewer with the team's record as it is now.")


class ReviewForm(forms.Form):
    """A reviewer's decision and the note the team reads with it."""

    decision = forms.ChoiceField(choices=[(value, value.capitalize()) for value in DECISIONS],
                                 widget=forms.RadioSelect, label="Decision")
    note = note_field(max_length=REVIEW_NOTE_MAX, label="Note to the team",
                      help_text="Required: the team reads it with the outcome, and it is kept in the audit trail.")


class TeamChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, team: Team) -> str:
        return f"{team.tenant.name} / {team.name}"


class StaffApplyForm(forms.Form):
    """A platform admin files an application for a team, with an override note when it falls short."""

    team = TeamChoiceField(queryset=Team.objects.none(), label="Tenant / team", empty_label="Choose a team")
    note = note_field(max_length=NOTE_MAX, label="Why the team needs high priority",
                      help_text="Shown to the team and to the reviewer.")
    override_note = note_field(
        max_length=OVERRIDE_NOTE_MAX, required=False, label="Override note",
        help_text="Only for a team below the thresholds: why it may hold high priority anyway. Audited.",
    )

    def __init__(self, *args, teams, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams

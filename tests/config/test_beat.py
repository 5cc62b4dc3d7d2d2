"""Beat with standbys (config.beat): a run is claimed in the database before it is sent, so it is sent once."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from config.beat import LeaderScheduler
from config.celery import app

pytestmark = pytest.mark.django_db(transaction=True)  # beat manages its connection as a process does


@pytest.fixture
def beats(monkeypatch):
    """Schedulers of this process whose sends are recorded, not published; the test's connection settings kept."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", connection.settings_dict["CONN_MAX_AGE"])
    monkeypatch.setattr(connection, "close_at", getattr(connection, "close_at", None), raising=False)
    sent = []

    def record(self, entry, producer=None, advance=True, **kwargs):
        sent.append((self, entry.name))

    monkeypatch.setattr(LeaderScheduler, "apply_async", record)
    made = []

    def make():
        beat = LeaderScheduler(app=app)
        made.append(beat)
        return beat

    yield make, sent
    for beat in made:
        beat.lock.release()


def run(*schedulers, seconds: float = 1.5) -> None:
    deadline = timezone.now() + timedelta(seconds=seconds)
    while timezone.now() < deadline:
        for scheduler in schedulers:
            scheduler.tick()


def make_due(name: str) -> int:
    task = PeriodicTask.objects.get(name=name)
    PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=timezone.now() - timedelta(hours=2))
    return task.total_run_count


def test_two_beats_that_both_believe_they_lead_send_a_due_run_once(beats):
    make, sent = beats
    # One database session holds the advisory lock for both, so both lead: only the claim stands between them.
    first, second = make(), make()
    runs = make_due("tenants.hp_revoke_due")
    for beat in (first, second):
        beat._reread()
    run(first, second)
    assert [name for _, name in sent].count("tenants.hp_revoke_due") == 1
    task = PeriodicTask.objects.get(name="tenants.hp_revoke_due")
    assert task.total_run_count == runs + 1
    assert timezone.now() - task.last_run_at < timedelta(seconds=5)


def test_a_new_leader_reads_what_the_old_one_sent_and_does_not_send_it_again(beats):
    make, sent = beats
    old = make()
    make_due("tenants.hp_revoke_due")
    old._reread()
    run(old, seconds=0.5)
    assert [name for _, name in sent].count("tenants.hp_revoke_due") == 1
    new = make()  # started later: its schedule is read from the database
    run(new)
    assert [name for beat, name in sent if beat is new].count("tenants.hp_revoke_due") == 0
    assert [name for beat, name in sent if beat is new].count("cloud.heartbeats_watch") >= 1


def test_a_standby_sends_nothing(beats, monkeypatch):
    make, sent = beats
    standby = make()
    monkeypatch.setattr(standby.lock, "acquire", lambda: False)
    make_due("tenants.hp_revoke_due")
    run(standby)
    assert sent == [] and standby.leading is False

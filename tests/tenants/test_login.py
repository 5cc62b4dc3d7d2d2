"""Console sign-in by e-mail, and the brute-force lock on it (django-axes)."""

import pytest
from django.test import Client

from tenants.models import User

PASSWORD = "correct horse battery staple"


@pytest.fixture
def person(db):
    return User.objects.create_user("Person@Example.com", PASSWORD)


def login(client, email, password):
    return client.post("/login/", {"username": email, "password": password})


def test_sign_in_by_email_in_any_case(person):
    """The address is the login, whatever its case; a user in no tenant is shown how to join one."""
    client = Client()
    response = login(client, "PERSON@example.com", PASSWORD)
    assert response.status_code == 302
    home = client.get("/", follow=True)
    assert home.status_code == 200 and "not in a tenant yet" in home.content.decode()


def test_sixth_wrong_password_locks_the_login_even_for_the_right_password(person):
    """After five failures from one address the account is locked there, right password included."""
    client = Client()
    for _ in range(5):
        assert login(client, person.email, "wrong-password").status_code == 200  # the form again, with an error
    locked = login(client, person.email, "wrong-password")
    assert locked.status_code in (403, 429)
    assert login(client, person.email, PASSWORD).status_code in (403, 429)
    assert "_auth_user_id" not in client.session


def test_home_requires_sign_in(db):
    """Anonymous visitors are sent to the sign-in page."""
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_lock_holds_whatever_the_spelling_of_the_address(person):
    """Once locked, the address in another case or with spaces around it is the same login, still locked."""
    client = Client()
    for _ in range(6):
        login(client, person.email, "wrong-password")
    for spelling in ["PERSON@EXAMPLE.COM", "Person@Example.com", f" {person.email}", f"{person.email.upper()}  "]:
        assert login(client, spelling, PASSWORD).status_code in (403, 429), spelling
    assert "_auth_user_id" not in client.session


def test_wrong_passwords_under_different_spellings_count_together(person):
    """Twelve wrong passwords under twelve spellings of one address lock it like twelve under one."""
    client = Client()
    spellings = [person.email, person.email.upper(), f" {person.email}", f"{person.email} ", "PERSON@example.com",
                 "person@EXAMPLE.com", "pErSoN@example.com", "Person@Example.COM", f"  {person.email.upper()}",
                 "perSON@exAMPLE.com", "PErson@example.Com", "persoN@Example.coM"]
    answers = [login(client, spelling, "wrong-password").status_code for spelling in spellings]
    assert answers[:5] == [200] * 5 and set(answers[5:]) <= {403, 429}
    assert login(client, person.email, PASSWORD).status_code in (403, 429)

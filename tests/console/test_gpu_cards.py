"""Reserve by GPU cards: one per GPU model and kind, prices by term, free per region, a size picks the offering."""

import pytest

from cloud.models import Offering
from provisioning.capacity import availability
from provisioning.gpu_cards import gpu_cards

pytestmark = pytest.mark.django_db


def test_cards_group_offerings_and_say_what_is_free_where(world):
    cards = gpu_cards()
    active = Offering.objects.filter(is_active=True)
    assert sum(len(c.offerings) for c in cards) == active.count()
    assert len({(c.gpu_model, c.kind) for c in cards}) == len(cards)
    free = availability(list(active))
    for card in cards:
        for size in card.offerings:
            offering = active.get(slug=size["slug"])
            assert size["on_demand"] == offering.price_per_gpu_hour
            assert size["reserved"] <= size["on_demand"]
            assert (size["spot_from"] is not None) is offering.spot_available
        for region in card.free:
            counted = [free[active.get(slug=o["slug"]).pk].get(region["slug"], {}) for o in card.offerings]
            key = "units" if card.kind == "bare_metal" else "gpus"
            assert region["free"] == max((c.get(key, 0) for c in counted), default=0)
            assert region["sold_out"] is (region["free"] == 0)


def test_the_page_shows_the_cards_and_a_size_fills_in_the_form(console, world):
    offering = Offering.objects.filter(is_active=True).first()
    page = console("t1_member").get("/reservations/new/", {"offering": offering.slug}).content.decode()
    assert "Choose a GPU" in page and f"?offering={offering.slug}#reservation-form" in page
    assert f'<option value="{offering.slug}" selected>' in page
    assert 'class="chosen"' in page
    assert "Choose a GPU" not in console("t1_viewer").get("/reservations/new/").content.decode()

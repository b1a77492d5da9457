"""The app's pages draw a wind-tunnel (``bijection``) run: custom arrays, per-position statics."""
import pytest

from tests import figures_fixtures as fx
from tests.app.test_app_pages import app, charts, ok


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("appbij")
    fx.make_bijection(d, name="bij")
    return d


@pytest.mark.parametrize("page", ["overview", "matrices", "trajectories", "compare"])
def test_every_page_draws_a_bijection_run(root, monkeypatch, page):
    at = ok(app(root, monkeypatch, page, "bij"))
    assert len(charts(at)) >= 1

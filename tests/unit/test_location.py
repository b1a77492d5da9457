"""Where a run lives (dyntool.location): URLs keep their roots and never pass through pathlib;
what dyntool does not serve is refused in one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from dyntool.errors import RunError
from dyntool.location import URLPath, is_url, join, location


@pytest.mark.parametrize("url,parent,name", [
    ("s3://b/x/y", "s3://b/x", "y"), ("s3://b/x/", "s3://b", "x"), ("s3://b", "s3://b", ""),
    ("file:///a/b", "file:///a", "b"), ("file:///a", "file:///", "a"), ("file:///", "file:///", ""),
])
def test_urlpath_parent_and_name_stay_above_the_root(url, parent, name):
    p = URLPath(url)
    assert str(p.parent) == parent and p.name == name
    assert str(p / "c") == join(url, "c") and (p / "c").parent == p


def test_relative_to_and_no_fspath():
    assert URLPath("s3://b/runs/x/y").relative_to(URLPath("s3://b/runs")) == Path("x/y")
    assert URLPath("file:///a/b").relative_to(URLPath("file:///")) == Path("a/b")
    assert not URLPath("s3://b/runsX").is_relative_to(URLPath("s3://b/runs"))
    with pytest.raises(TypeError):                 # never a local path made from a URL
        Path(URLPath("s3://b/x"))


@pytest.mark.parametrize("text,says", [("", "empty"), ("gs://b/x", "gs://"), ("http://h/x", "http://"),
                                      ("s3://b/../x", "'..'"), ("s3:///x", "no bucket"),
                                      ("file://rel/x", "absolute"), ("~no-such-user-here/x", "no such user"),
                                      ("a\x00b", "NUL")])
def test_refused_in_one_line(text, says):
    with pytest.raises(RunError, match=None) as e:
        location(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_local_paths_and_urls_are_told_apart():
    assert location("runs/x") == Path("runs/x") and not is_url(location("runs/x"))
    assert is_url(location("s3://b/x")) and is_url("file:///x") and not is_url("s3:/b")
    assert location("C:/runs") == Path("C:/runs")            # one letter: a drive, not a scheme

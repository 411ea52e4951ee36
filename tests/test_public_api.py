"""One public API (issue 46): ``fsdpdoctor.analyze`` is the front door with every option (the fields of
one ``Options``, also exported), ``__all__`` names what the package offers, and ``py.typed`` tells type
checkers its annotations are meant for them."""

from __future__ import annotations

import dataclasses
import inspect
import re
import shutil
from pathlib import Path

import pytest

import fsdpdoctor
from fsdpdoctor import api
from fsdpdoctor.options import FIELDS
from bundled import TRACES  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]


def test_the_front_door_takes_every_option_the_api_does(tmp_path):
    """The run folder of a job with two capture windows: ``window=`` picks one, from the package as
    from ``fsdpdoctor.api`` (it was a TypeError at the package's door)."""
    run = tmp_path / "run"
    shutil.copytree(TRACES / "straggler", run / "window-20")
    shutil.copytree(TRACES / "ddp_default", run / "window-300")
    first = fsdpdoctor.analyze(run, window=20, use_summaries=False)
    assert Path(first.source).name == "window-20" and first.to_json() == api.analyze(
        run, window=20, use_summaries=False).to_json()
    assert Path(fsdpdoctor.analyze(run, use_summaries=False).source).name == "window-300"   # the latest
    opts = fsdpdoctor.Options(window=20, ranks=[1], use_summaries=False)
    one = fsdpdoctor.analyze(run, opts)
    assert [r.rank for r in one.ranks] == [1] and Path(one.source).name == "window-20"
    assert [r.rank for r in fsdpdoctor.analyze(run, opts, ranks=[0]).ranks] == [0]   # a keyword wins
    with pytest.raises(TypeError, match="windw"):
        fsdpdoctor.analyze(run, windw=20)


def test_one_signature_and_one_options_object():
    assert fsdpdoctor.Options is api.Options
    front, inner = inspect.signature(fsdpdoctor.analyze), inspect.signature(api.analyze)
    assert list(front.parameters) == list(inner.parameters) == ["path", "options", "selection"]
    assert set(FIELDS) == {f.name for f in dataclasses.fields(fsdpdoctor.Options)}
    for name in FIELDS:   # every option is named where a user reads how to call it
        assert f"``{name}``" in fsdpdoctor.analyze.__doc__, name


def test_all_names_what_the_package_offers():
    assert {"analyze", "Options", "Analysis", "Finding", "StepBreakdown", "__version__"} <= set(fsdpdoctor.__all__)
    for name in fsdpdoctor.__all__:
        assert getattr(fsdpdoctor, name) is not None, name
    space: dict = {}
    exec("from fsdpdoctor import *", space)
    assert space["analyze"] is fsdpdoctor.analyze and space["Options"] is fsdpdoctor.Options


def test_the_package_is_marked_typed():
    assert (ROOT / "fsdpdoctor" / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    package_data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^"fsdpdoctor" = \[[^]]*"py\.typed"', package_data, re.M), package_data


def test_the_library_page_lists_every_option():
    page = (ROOT / "docs" / "library.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", page, re.M)
    assert rows == list(FIELDS)
    for name in fsdpdoctor.__all__:
        assert f"`{name}`" in page, name

"""``@result``'s ``__init__`` (closures, then the compiled one once a class is hot) answers as @dataclass's."""

from __future__ import annotations

import dataclasses
from dataclasses import field

import pytest

from fsdpdoctor.results import serial
from fsdpdoctor.results.serial import result


def _pair():
    """The same declarations as a @result class and as a plain @dataclass."""
    def body():
        return {"__annotations__": {"a": "int", "b": "str", "c": "float", "d": "list[int]"},
                "c": 0.5, "d": field(default_factory=list), "__module__": __name__}
    return (result(type("Made", (), body())),
            dataclasses.dataclass(type("Made", (), body()), repr=False, eq=False))


CALLS = [((1, "x"), {}), ((1,), {"b": "y"}), ((), {"a": 1, "b": "x", "d": [3]}), ((1, "x", 2.0, [4]), {}),
         ((1,), {}), ((1, "x", 2.0, [4], 5), {}), ((1,), {"a": 2, "b": "x"}), ((1, "x"), {"e": 1}), ((), {})]


def _outcome(cls, args, kw):
    try:
        made = cls(*args, **kw)
    except TypeError as exc:
        return "error", str(exc).replace("Made.__init__() ", "").replace("__init__() ", "")
    return "made", [(f.name, getattr(made, f.name)) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("hot", [False, True])
def test_the_same_objects_and_errors_as_dataclass(monkeypatch, hot):
    if hot:
        monkeypatch.setattr(serial, "_HOT", 0)   # the compiled __init__ from the first instance
    ours, theirs = _pair()
    for args, kw in CALLS:
        assert _outcome(ours, args, kw) == _outcome(theirs, args, kw), (args, kw)
    a, b = ours(1, "x"), ours(1, "x")
    assert a.d is not b.d and a == b and repr(a) == "Made(a=1, b='x', c=0.5, d=[])"


def test_a_class_past_hot_gets_the_compiled_init(monkeypatch):
    monkeypatch.setattr(serial, "_HOT", 3)
    ours, _ = _pair()
    first = ours.__init__
    for i in range(5):
        assert ours(i, "x").a == i
    assert ours.__init__ is not first and ours(7, b="z", d=[1]).d == [1]


def test_a_class_with_post_init_keeps_dataclass_init():
    @result
    class WithPost:
        """A class whose __init__ must call __post_init__."""

        a: int
        b: int = 0

        def __post_init__(self):
            self.b = self.a * 2

    assert WithPost(3).b == 6


@pytest.mark.parametrize("hot", [False, True])
def test_a_frozen_result_answers_as_a_frozen_dataclass(monkeypatch, hot):
    """@result(frozen=True) (closures for __init__, __setattr__, __delattr__, __hash__): the same
    objects, errors, hashes and equality as @dataclass(frozen=True)."""
    if hot:
        monkeypatch.setattr(serial, "_HOT", 0)

    def body():
        return {"__annotations__": {"a": "int", "b": "str", "c": "tuple", "d": "float"},
                "c": (), "d": field(default=0.5, compare=False), "__module__": __name__}
    ours = result(frozen=True)(type("Made", (), body()))
    theirs = dataclasses.dataclass(frozen=True)(type("Made", (), body()))
    for cls in (ours, theirs):
        assert dataclasses.is_dataclass(cls)
    x, y = ours(1, "x", (2,)), theirs(1, "x", (2,))
    assert repr(x) == repr(y) and hash(x) == hash(y) and hash(ours(1, "x", (2,), 9.0)) == hash(x)
    assert x == ours(1, "x", (2,), 7.0) and x != ours(2, "x") and x != y
    assert dataclasses.replace(x, a=5).a == 5 and dataclasses.replace(y, a=5).a == 5
    for obj in (x, y):
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'a'"):
            obj.a = 2
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'z'"):
            obj.z = 2
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'b'"):
            del obj.b
    for args, kw in CALLS:
        assert _outcome(ours, args, kw) == _outcome(theirs, args, kw), (args, kw)

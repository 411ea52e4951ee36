"""What every result type shares: ``@result`` (a dataclass with one shared ``__repr__`` and ``__eq__``),
``plain`` (a result as plain dicts and lists, to be written out) and ``dumps_indented`` (the indented
JSON text of such a document)."""

from __future__ import annotations

import dataclasses
import json
import reprlib
import sys
from dataclasses import dataclass

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names



def _shared_repr(self) -> str:
    return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in type(self)._repr_fields)})"


def _shared_eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = type(self)._eq_fields
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _plain_fields(c, options: dict) -> bool:
    """Whether ``_init_of`` writes the class's ``__init__``: not where it defines its own, has
    ``__post_init__``, ``InitVar`` or ``ClassVar`` annotations, keyword-only or non-init fields."""
    if options.get("init", True) is False or options.get("kw_only"):
        return False
    if "__init__" in c.__dict__ or hasattr(c, "__post_init__"):
        return False
    for klass in c.__mro__[:-1]:
        for name, note in klass.__dict__.get("__annotations__", {}).items():
            if isinstance(note, str):
                if "InitVar" in note or "KW_ONLY" in note or "ClassVar" in note:
                    return False
            elif _special(note):
                return False
            value = klass.__dict__.get(name)
            if isinstance(value, dataclasses.Field) and (not value.init or value.kw_only is True):
                return False
    return True


def _special(note) -> bool:
    """An annotation (an object: the modules the decoders read have no ``from __future__ import
    annotations``) that only the generated ``__init__`` handles: ``InitVar``, ``KW_ONLY``, ``ClassVar``."""
    if note is dataclasses.KW_ONLY or note is dataclasses.InitVar or isinstance(note, dataclasses.InitVar):
        return True
    typing = sys.modules.get("typing")  # not loaded: no annotation is a ClassVar
    return typing is not None and (note is typing.ClassVar or getattr(note, "__origin__", None) is typing.ClassVar)


# instances made by ``_init_of``'s closures before the class's compiled ``__init__`` replaces them
_HOT = 100


def _init_of(c, fields, frozen: bool = False):
    """The ``__init__`` @dataclass would write for ``c`` (the same arguments, defaults, factories, errors
    for a missing, unexpected or repeated argument, attributes set in field order), made of closures
    until the class has made ``_HOT`` instances, then the one @dataclass compiles (a closure's instance
    costs ~2-5x a compiled one's): compiling the 33 generated ``__init__`` at every start was 45 M
    instructions of `analyze`'s imports (callgrind: 687 -> 642 M), where most of these classes make a
    few instances in a run (v100: 32 classes, 461 instances)."""
    names = tuple(f.name for f in fields)
    fills = [(f.name, f.default, f.default_factory) for f in fields]
    own = f"{c.__qualname__}.__init__()"
    made = [0]
    assign = object.__setattr__ if frozen else setattr

    def __init__(self, *args, **kw):
        made[0] += 1
        if made[0] > _HOT:
            c.__init__ = compiled = _compiled_init(c, fields, frozen)
            return compiled(self, *args, **kw)
        if len(args) == len(names) and not kw:
            values = args
        else:
            values = _bound(own, names, fills, args, kw)
        for name, value in zip(names, values):
            assign(self, name, value)

    __init__.__qualname__ = f"{c.__qualname__}.__init__"
    __init__.__module__ = c.__module__
    return __init__


def _bound(own: str, names: tuple, fills: list, args: tuple, kw: dict) -> list:
    """The field values of a call, or the TypeError Python raises for it (in its order and words)."""
    required = sum(default is dataclasses.MISSING and factory is dataclasses.MISSING for _, default, factory in fills)
    if len(args) > len(names):
        takes = f"from {required + 1} to {len(names) + 1}" if required < len(names) else f"{len(names) + 1}"
        raise TypeError(f"{own} takes {takes} positional arguments but {len(args) + 1} were given")
    position = {n: i for i, n in enumerate(names)}
    for name in kw:
        if name not in position:
            raise TypeError(f"{own} got an unexpected keyword argument '{name}'")
        if position[name] < len(args):
            raise TypeError(f"{own} got multiple values for argument '{name}'")
    lacking = [repr(n) for n, default, factory in fills[len(args):]
               if n not in kw and default is dataclasses.MISSING and factory is dataclasses.MISSING]
    if lacking:
        said = lacking[0] if len(lacking) == 1 else (
            f"{lacking[0]} and {lacking[1]}" if len(lacking) == 2 else ", ".join(lacking[:-1]) + f", and {lacking[-1]}")
        raise TypeError(f"{own} missing {len(lacking)} required positional argument{'s' if len(lacking) > 1 else ''}: "
                        + said)
    values = list(args)
    for name, default, factory in fills[len(args):]:
        values.append(kw[name] if name in kw else default if factory is dataclasses.MISSING else factory())
    return values


def _compiled_init(c, fields, frozen: bool = False):
    """The ``__init__`` @dataclass generates for ``c``'s fields, made on a copy of their declarations."""
    ns = {"__annotations__": {f.name: f.type for f in fields}, "__module__": c.__module__,
          "__qualname__": c.__qualname__}
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            ns[f.name] = dataclasses.field(default_factory=f.default_factory)
        elif f.default is not dataclasses.MISSING:
            ns[f.name] = f.default
    return dataclass(type(c.__name__, (), ns), repr=False, eq=False, frozen=frozen).__init__


def _frozen(c, names: tuple[str, ...]) -> None:
    """The ``__setattr__``, ``__delattr__`` and ``__hash__`` @dataclass(frozen=True) generates for ``c``
    (the same errors, and the hash of the tuple of the compared fields), as closures."""
    def __setattr__(self, name, value):
        if type(self) is c or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(c, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is c or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(c, self).__delattr__(name)

    for fn in (__setattr__, __delattr__):
        if fn.__name__ in c.__dict__:
            raise TypeError(f"Cannot overwrite attribute {fn.__name__} in class {c.__name__}")
        fn.__qualname__ = f"{c.__qualname__}.{fn.__name__}"
        setattr(c, fn.__name__, fn)
    c._hash_fields = tuple(f.name for f in dataclasses.fields(c) if (f.compare if f.hash is None else f.hash))
    c.__hash__ = _shared_hash


def _shared_hash(self) -> int:
    return hash(tuple(getattr(self, n) for n in type(self)._hash_fields))


def result(cls=None, /, **options):
    """``@dataclass`` with one shared ``__repr__`` and ``__eq__`` (the same text and the same answers)
    instead of a pair generated for each class, and an ``__init__`` not compiled (``_init_of``): @dataclass
    compiles the source of every generated method at every start, and these classes are loaded by every
    verb. A frozen class gets its ``__setattr__``, ``__delattr__`` and ``__hash__`` as closures too."""
    def wrap(c):
        plain = _plain_fields(c, options)   # else what only the generated __init__ does
        if options.get("frozen") and ("__hash__" in c.__dict__ or "__eq__" in c.__dict__):
            plain = False   # @dataclass keeps a class's own hash: left to it
        frozen = plain and bool(options.get("frozen"))   # the closures of _frozen, not compiled methods
        c = dataclass(c, repr=False, eq=False, **(dict(options, init=False, frozen=False) if plain else options))
        fields = dataclasses.fields(c)
        if plain:
            c.__init__ = _init_of(c, fields, frozen)
        c._repr_fields = tuple(f.name for f in fields if f.repr)
        c._eq_fields = tuple(f.name for f in fields if f.compare)
        c.__repr__ = reprlib.recursive_repr()(_shared_repr)
        c.__eq__ = _shared_eq
        c.__hash__ = None   # as @dataclass(eq=True) leaves a mutable class: unhashable
        if frozen:
            _frozen(c, tuple(f.name for f in fields))
        return c

    return wrap if cls is None else wrap(cls)

def plain(v):
    """``dataclasses.asdict`` of a result value without its deep copies of the leaves (a result is
    turned into a dict to be written out: the copies cost more than the walk)."""
    cls = type(v)
    if cls is str or cls is float or cls is int or v is None or cls is bool:
        return v
    if hasattr(cls, "__dataclass_fields__"):
        return {name: plain(getattr(v, name)) for name in _field_names(cls)}
    if cls is list:
        return [plain(x) for x in v]
    if cls is dict:
        return {plain(k): plain(x) for k, x in v.items()}
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # a named tuple, rebuilt as asdict does
        return cls(*[plain(x) for x in v])
    if isinstance(v, (list, tuple)):
        return cls(plain(x) for x in v)
    if isinstance(v, dict):
        return {plain(k): plain(x) for k, x in v.items()}
    return v


def dumps_indented(d) -> str:
    """``json.dumps(d, indent=2, default=str)``, byte for byte, at the C encoder's speed: the stdlib
    writes an indented document through its pure-Python encoder (4-5x slower: most of a many-rank
    run's reduce), so the compact text is indented by msgspec, which copies every token as written.
    A document with NaN or infinity (not JSON, which msgspec refuses) takes the stdlib's way."""
    import msgspec

    text = json.dumps(d, default=str)
    try:
        return msgspec.json.format(text.encode(), indent=2).decode()
    except msgspec.DecodeError:
        return json.dumps(d, indent=2, default=str)

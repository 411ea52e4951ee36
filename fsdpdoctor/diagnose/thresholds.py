"""Placeholder; the threshold table lands with the rules."""

from fsdpdoctor.errors import InputError


def parse_assignment(item: str):
    if "=" not in item:
        raise InputError(None, f"--threshold expects NAME=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    return k.strip(), float(v.rstrip("%")) / (100 if v.endswith("%") else 1)


def load_overrides(path):
    return {}

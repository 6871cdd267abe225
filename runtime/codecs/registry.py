"""The codecs by name: each codec's file registers its class (``@register``), and a codec's JSON names the class that
reads it back (``from_json``). The built-in codecs register when ``runtime.codecs`` is imported; a codec registered
from another module exists in that Python process only (a browser installs the runtime's wheel, so a page knows the
built-in codecs and no others)."""

from __future__ import annotations

from runtime.codecs.base import Codec, CodecError

_REGISTERED: dict[str, type[Codec]] = {}


def register[C: type[Codec]](cls: C) -> C:
    """Make ``cls`` the codec named ``cls.name`` (a class decorator). Registering the same class again does nothing;
    another class under a registered name is a ``ValueError``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a codec class declares its name (a non-empty string), {cls.__qualname__} does not")
    existing = _REGISTERED.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"codec {name!r} is registered already, by {existing.__module__}.{existing.__qualname__}")
    _REGISTERED[name] = cls
    return cls


def names() -> tuple[str, ...]:
    """The registered codecs' names, in the order they registered (the built-ins first: none, int8, topk)."""
    return tuple(_REGISTERED)


def lookup(name: str) -> type[Codec]:
    """The codec class registered as ``name``, or a ``bad_codec`` ``CodecError`` listing the choices."""
    try:
        return _REGISTERED[name]
    except KeyError:
        raise CodecError(f"unknown codec {name!r}; choose one of {', '.join(_REGISTERED)}", "bad_codec") from None


def from_json(data: object) -> Codec:
    """A codec from its JSON object ``{"name", "block", ...}``: the class registered under ``name`` reads the rest."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise CodecError(f"a codec is an object with a name, got {data!r}", "bad_codec")
    return lookup(data["name"]).from_fields(data)

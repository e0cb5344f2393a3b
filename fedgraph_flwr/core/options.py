"""Typed algorithm options: one frozen dataclass per algorithm, validated at construction.

Each field is one run-config key, ``<prefix>-<field name with _ -> ->`` (e.g.
``FedAuxOptions.sigma`` <-> ``fedaux-sigma``), declared with :func:`option`: its default,
a one-line doc, and its allowed choices or range. Constructing an instance coerces every
value to the field's type (bool, int, float or str) and checks it; a bad value raises
:class:`ConfigError` with one line naming the key, the value and what is allowed::

    @dataclass(frozen=True)
    class FedAuxOptions(Options, prefix="fedaux"):
        sigma: float = option(1.0, "Gaussian kernel bandwidth σ", low=0.0, low_inclusive=False)

    FedAuxOptions.from_config({"fedaux-sigma": -1})
    # ConfigError: fedaux-sigma=-1.0 is out of range: must be > 0

A method whose code can follow its paper, its official code or OpenFGL passes
``profiles`` (profile value -> ``{field name: value}``), its default profile first, and
``published`` (which profile reproduces which published figures; shown on its page)::

    class FGGPOptions(Options, prefix="fggp", profiles={
            "official": {"flavour": "official", "knn_every": 20},
            "openfgl": {"flavour": "openfgl", "knn_every": 1}}):

That adds the key ``<prefix>-reproduce`` (choices: the profile values, default: the first)
as the class's first field. When a config is resolved (:meth:`Options.from_config`), the
chosen profile sets each of its switches the config does not set itself: explicit switches
win. The default profile must hold each switch's own default, so that choosing it changes
nothing (checked when the method is registered: :meth:`Options.check_profiles`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

OPTION_TYPES = (bool, int, float, str)
#: The field (and ``<prefix>-reproduce`` key) a class with ``profiles`` gains.
PROFILE_FIELD = "reproduce"


class ConfigError(ValueError):
    """A one-line problem with the run configuration."""


def coerce(key: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (bool, int, float, str); strings such as "5" or "true" are read."""
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes"):
                    return True
                if value.lower() in ("false", "0", "no"):
                    return False
                raise ValueError
            return bool(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r} is not a valid {kind.__name__}") from None


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """What :func:`option` records about a field (kept in the field's metadata)."""

    doc: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    key: str | None = None  # overrides <prefix>-<name>

    def allowed(self) -> str:
        """The allowed values in words: ``one of a, b``, ``> 0``, ``in [0, 1]``."""
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.low is not None and self.high is not None:
            return (f"in {'[' if self.low_inclusive else '('}{self.low:g}, "
                    f"{self.high:g}{']' if self.high_inclusive else ')'}")
        if self.low is not None:
            return f"{'>=' if self.low_inclusive else '>'} {self.low:g}"
        if self.high is not None:
            return f"{'<=' if self.high_inclusive else '<'} {self.high:g}"
        return "any value"

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is within this option's choices and bounds."""
        if self.choices is not None:
            return value in self.choices
        # Written as "not within" so that NaN is refused too.
        if self.low is not None and not (value >= self.low if self.low_inclusive else value > self.low):
            return False
        if self.high is not None and not (value <= self.high if self.high_inclusive else value < self.high):
            return False
        return True


def option(
    default: Any,
    doc: str,
    *,
    choices: Sequence[Any] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    key: str | None = None,
) -> Any:
    """A field of an :class:`Options` dataclass: default, one-line doc, choices or range."""
    spec = OptionSpec(doc, tuple(choices) if choices is not None else None, low, high,
                      low_inclusive, high_inclusive, key)
    return dataclasses.field(default=default, metadata={"option": spec})


def context(default: Any, doc: str) -> Any:
    """A field of an :class:`Options` dataclass that is not a run-config key: set by the
    engine (this round's number, the algorithm's options object), not by the user."""
    if isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata={"context": doc})
    return dataclasses.field(default=default, metadata={"context": doc})


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One field of an :class:`Options` class: its name, run-config key, type and spec."""

    name: str
    key: str
    kind: type
    spec: OptionSpec


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of every algorithm's options; subclasses are frozen dataclasses of :func:`option` fields.

    ``class FedAuxOptions(Options, prefix="fedaux")`` sets the key prefix (without one,
    a field's key is its name with ``_`` -> ``-``, as the common keys). An algorithm
    without options subclasses it with no fields. Fields declared with :func:`context`
    are not run-config keys and are neither coerced nor checked here.
    """

    prefix: ClassVar[str] = ""
    #: Profile value -> ``{switch field name: value}``; the first is the default.
    profiles: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Which profile reproduces which published figures, and where that is shown (one line).
    published: ClassVar[str] = ""

    def __init_subclass__(cls, prefix: str = "",
                          profiles: Mapping[str, Mapping[str, Any]] | None = None,
                          published: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if prefix:
            cls.prefix = prefix
        if published:
            cls.published = published
        if profiles:
            # Runs before @dataclass reads the class: the profile key becomes its first field.
            cls.profiles = {name: dict(switches) for name, switches in profiles.items()}
            names = tuple(cls.profiles)
            doc = (f"reproduction profile: {' | '.join(names)}; sets "
                   f"{len(cls.switches())} keys (see the method's page)")
            cls.__annotations__ = {PROFILE_FIELD: "str",
                                   **cls.__dict__.get("__annotations__", {})}
            setattr(cls, PROFILE_FIELD, option(names[0], doc, choices=names))

    def __post_init__(self) -> None:
        for f in self._fields():
            value = coerce(f.key, getattr(self, f.name), f.kind)
            if not f.spec.admits(value):
                what = "not a valid choice" if f.spec.choices is not None else "out of range"
                raise ConfigError(f"{f.key}={_show(value)} is {what}: must be {f.spec.allowed()}")
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Checks beyond one field's choices or range; raise :meth:`invalid` to refuse."""

    def check_run(self, config: Any) -> None:
        """Checks against the run's common keys (e.g. ``rounds``), made when the server's
        :class:`~fedgraph_flwr.config.RunConfig` (``config``, typed so by the subclass: the
        configuration sits above this package) is built, before any client is contacted;
        raise :class:`ConfigError` to refuse."""

    def invalid(self, name: str, why: str) -> ConfigError:
        """The one-line error for field ``name``: ``<key>=<value> is invalid: <why>``."""
        return ConfigError(f"{self.key(name)}={_show(getattr(self, name))} is invalid: {why}")

    # --- the class as a set of run-config keys ------------------------------------------
    @classmethod
    @functools.cache
    def _fields(cls) -> tuple[OptionField, ...]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            if "context" in f.metadata:
                continue
            spec = f.metadata.get("option")
            if not isinstance(spec, OptionSpec):
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
            kind = hints[f.name]
            if kind not in OPTION_TYPES:
                raise TypeError(f"{cls.__name__}.{f.name}: type {kind} is not bool, int, float or str")
            name = f.name.replace("_", "-")
            key = spec.key or (f"{cls.prefix}-{name}" if cls.prefix else name)
            out.append(OptionField(f.name, key, kind, spec))
        return tuple(out)

    @classmethod
    def key(cls, name: str) -> str:
        """Run-config key of field ``name``."""
        return next(f.key for f in cls._fields() if f.name == name)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every run-config key of these options, in field order."""
        return tuple(f.key for f in cls._fields())

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``{key: default}`` in field order."""
        return cls().to_config()

    @classmethod
    def docs(cls) -> dict[str, str]:
        """``{key: one-line doc}`` in field order."""
        return {f.key: f.spec.doc for f in cls._fields()}

    @classmethod
    def ranges(cls) -> dict[str, str]:
        """``{key: allowed range}`` of the fields with a range (``> 0``, ``in [0, 1]``)."""
        return {f.key: f.spec.allowed() for f in cls._fields()
                if f.spec.low is not None or f.spec.high is not None}

    @classmethod
    def switches(cls) -> tuple[str, ...]:
        """Field names some profile sets, in the order the profiles name them."""
        return tuple(dict.fromkeys(name for switches in cls.profiles.values() for name in switches))

    @classmethod
    def field_name(cls, key: str) -> str:
        """The field name of run-config ``key``."""
        return next(f.name for f in cls._fields() if f.key == key)

    @classmethod
    def profile_key(cls) -> str | None:
        """``<prefix>-reproduce``, or None for a class without profiles."""
        return cls.key(PROFILE_FIELD) if cls.profiles else None

    @classmethod
    def switch_keys(cls) -> tuple[str, ...]:
        """Run-config keys some profile sets."""
        return tuple(cls.key(name) for name in cls.switches())

    @classmethod
    def behaviour_switch_keys(cls) -> tuple[str, ...]:
        """The :meth:`switch_keys` that choose a behaviour (a bool, or a str of choices): kept
        out of pyproject's block. The numbers a profile sets (a code's weight, a period)
        stay there, as the method's tuning keys."""
        fields = {f.key: f for f in cls._fields()}
        return tuple(key for key in cls.switch_keys()
                     if fields[key].kind is bool or fields[key].spec.choices is not None)

    @classmethod
    def check_profiles(cls) -> None:
        """Every profile names fields of this class with valid values, and the default
        profile holds each switch's default (so that choosing it changes nothing)."""
        if not cls.profiles:
            return
        fields = {f.name: f for f in cls._fields()}
        for profile, switches in cls.profiles.items():
            for name, value in switches.items():
                if name not in fields or name == PROFILE_FIELD:
                    raise TypeError(f"{cls.__name__}: profile {profile!r} sets {name!r}, "
                                    f"not a switch of this class")
                if not fields[name].spec.admits(coerce(fields[name].key, value, fields[name].kind)):
                    raise TypeError(f"{cls.__name__}: profile {profile!r} sets {name}={value!r}, "
                                    f"which is not {fields[name].spec.allowed()}")
        default_profile = next(iter(cls.profiles))
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name in cls.switches():
            value = cls.profiles[default_profile].get(name, defaults[name])
            if value != defaults[name]:
                raise TypeError(f"{cls.__name__}: the default profile {default_profile!r} sets "
                                f"{name}={value!r}, but its default is {defaults[name]!r}")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        """``{key: value}`` of every switch under ``profile`` (a switch the profile does not
        name keeps its default); a one-line ConfigError for an unknown profile."""
        if profile not in cls.profiles:
            key = f"{cls.prefix}-{PROFILE_FIELD}"
            close = difflib.get_close_matches(profile, list(cls.profiles), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={profile!r} is not a valid choice: must be one of "
                              f"{', '.join(cls.profiles)}{hint}")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        chosen = cls.profiles[profile]
        return {cls.key(name): chosen.get(name, defaults[name]) for name in cls.switches()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Self:
        """The options named in ``config`` (other keys are ignored; missing ones default;
        switches missing take the value of the config's reproduction profile)."""
        given = {f.name: config[f.key] for f in cls._fields() if f.key in config}
        if cls.profiles:
            profile = str(given.get(PROFILE_FIELD, next(iter(cls.profiles))))
            for key, value in cls.profile_values(profile).items():
                given.setdefault(cls.field_name(key), value)
        return cls(**given)

    def to_config(self) -> dict[str, Any]:
        """``{key: value}`` in field order."""
        return {f.key: getattr(self, f.name) for f in self._fields()}

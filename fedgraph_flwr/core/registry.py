"""The methods by name, each imported the first time it is asked for.

A method is a client trainer, a server aggregator and the :class:`~.options.Options` class
of its own keys: an :class:`Algorithm`. :data:`ALGORITHMS` maps each name to its entry.
The built-in methods are :data:`BUILT_IN`: method ``name`` is the module
``fedgraph_flwr.algorithms.<name>``, whose ``ALGORITHM`` is its entry, and reading
``ALGORITHMS[name]`` (or :func:`get_algorithm`) imports that module, with its models, then
and not before. The names, ``name in ALGORITHMS`` and ``len(ALGORITHMS)`` import nothing;
``ALGORITHMS.values()`` and ``.items()`` import every method (the pyproject block, README's
table and the tests that walk every method need them all). :func:`declare` adds a method
the same way from another module (a test's throwaway method, a method kept outside this
package); :func:`register` adds one already imported (tests/phase_demo.py).

This module names the methods' modules as strings and never imports them itself, so the
engine and the configuration, which import it, load no method (tests/test_import_graph.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .bases import Aggregator, ClientTrainer
from .options import Options
from .phases import check_phases

#: Where the built-in methods live: method ``name`` is the module ``<BUILT_IN_PACKAGE>.<name>``.
BUILT_IN_PACKAGE = "fedgraph_flwr.algorithms"

#: The built-in methods, in the order of their keys in pyproject.toml (and README's table).
#: A new method is its module and one name here.
BUILT_IN = (
    "fedavg", "local", "fedaux", "fedprox", "fedper", "fedpub", "gcfl", "apfl", "fediih",
    "fedspray", "fedgta", "fedstar", "fedlit", "fedgnn", "fedsage", "adafgl", "scaffold", "moon",
    "fedproto", "fedtgp", "feddc", "fedtad", "fgssl", "fedgl", "fedgcn", "feddep", "fggp", "cufl",
)


@dataclass(frozen=True)
class Algorithm:
    """A named pair of trainer and aggregator and the :class:`Options` class of its own keys,
    checked at construction: phases that end with ``train``, both parts built from
    ``options`` (their ``options_class``), whose keys are ``<name>-*``.

    ``legacy_values`` names keys added later whose default is not what runs made before
    the key existed did: the value those runs used, or a function of their filled config
    that gives it, so their saved results are read as what they were
    (``fedgraph_flwr.experiments.saved_config``).
    """

    name: str
    trainer: type[ClientTrainer[Any]]
    aggregator: type[Aggregator[Any]]
    options: type[Options]
    legacy_values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = self.name
        check_phases(self.trainer.phases)
        for part in (self.trainer, self.aggregator):
            if part.options_class is not self.options:
                raise ValueError(f"{name}: {part.__name__}.options_class is "
                                 f"{part.options_class.__name__}, not {self.options.__name__}")
        defaults = self.options.defaults()  # also checks every field and that the defaults are valid
        self.options.check_profiles()
        foreign = sorted(k for k in defaults if not k.startswith(f"{name}-"))
        if foreign:
            raise ValueError(f"{name}: option keys must start with '{name}-': {foreign}")
        undefaulted = sorted(set(self.legacy_values) - set(defaults))
        if undefaulted:
            raise ValueError(f"{name}: legacy_values for keys it has no default for: {undefaulted}")

    @property
    def config_defaults(self) -> dict[str, Any]:
        """``{key: default}`` of the algorithm's own keys (from :attr:`options`)."""
        return self.options.defaults()


class Registry(Mapping[str, Algorithm]):
    """Name -> :class:`Algorithm`, in registration order; a declared method's module is
    imported when its entry is first read (the module docstring)."""

    def __init__(self, package: str, built_in: tuple[str, ...]) -> None:
        self._built_in = built_in
        self._names: list[str] = []
        self._modules: dict[str, str] = {}  # name -> the module whose ALGORITHM it is
        self._entries: dict[str, Algorithm] = {}  # the methods imported so far
        for name in built_in:
            self.declare(name, f"{package}.{name}")

    def __getitem__(self, name: str) -> Algorithm:
        if name not in self._entries:
            if name not in self._modules:
                raise KeyError(name)
            self._entries[name] = self._import(name, self._modules[name])
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names  # without importing the method

    def __reduce__(self) -> str:
        # Pickled, it names the module's registry, so that a process receiving a function
        # that refers to it (Ray's workers) reads its own, never a copy of the sender's.
        return "ALGORITHMS"

    @staticmethod
    def _import(name: str, module_name: str) -> Algorithm:
        module = importlib.import_module(module_name)
        entry = getattr(module, "ALGORITHM", None)
        if not isinstance(entry, Algorithm) or entry.name != name:
            raise TypeError(f"{module.__name__} must define ALGORITHM = Algorithm({name!r}, ...)")
        return entry

    def owner_of(self, key: str) -> str | None:
        """The method whose option ``key`` would be (its name and ``-`` begin it: the
        longest such name), or None; nothing is imported."""
        owners = [name for name in self._names if key.startswith(f"{name}-")]
        return max(owners, key=len) if owners else None

    def declare(self, name: str, module: str) -> None:
        """Add method ``name``, whose entry is the ``ALGORITHM`` of ``module``, imported
        when the method is first asked for (after the methods already here)."""
        self._check_new_name(name)
        self._names.append(name)
        self._modules[name] = module

    def add(self, algorithm: Algorithm) -> Algorithm:
        """Add an already imported method under its name (after the methods already here)."""
        self._check_new_name(algorithm.name)
        self._names.append(algorithm.name)
        self._entries[algorithm.name] = algorithm
        return algorithm

    def remove(self, name: str) -> None:
        """Undo :meth:`declare` or :meth:`add` (a test's method); the built-in methods stay."""
        if name in self._built_in:
            raise ValueError(f"algorithm {name!r} is built in")
        if name in self._names:
            self._names.remove(name)
            self._modules.pop(name, None)
            self._entries.pop(name, None)

    def _check_new_name(self, name: str) -> None:
        if name != name.lower():
            raise ValueError(f"algorithm names are lower-case, got {name!r}")
        if name in self:
            raise ValueError(f"algorithm {name!r} is already registered")
        clash = [n for n in self._names
                 if f"{n}-".startswith(f"{name}-") or f"{name}-".startswith(f"{n}-")]
        if clash:  # its keys, <name>-*, could be read as another method's
            raise ValueError(f"algorithm {name!r} and {clash[0]!r}: one name and '-' begins "
                             f"the other")


ALGORITHMS = Registry(BUILT_IN_PACKAGE, BUILT_IN)


def register(
    name: str,
    trainer: type[ClientTrainer[Any]],
    aggregator: type[Aggregator[Any]],
    options: type[Options],
    legacy_values: dict[str, Any] | None = None,
) -> Algorithm:
    """Register an already imported method under a lower-case name (:class:`Algorithm`
    checks its parts); the built-in ones are in :data:`BUILT_IN` instead."""
    return ALGORITHMS.add(Algorithm(name, trainer, aggregator, options, dict(legacy_values or {})))


def declare(name: str, module: str) -> None:
    """Add method ``name``, the ``ALGORITHM`` of ``module``, imported when first asked for
    (the built-in ones are in :data:`BUILT_IN` instead)."""
    ALGORITHMS.declare(name, module)


def unregister(name: str) -> None:
    """Remove a method :func:`declare` or :func:`register` added (a test's, when it is done)."""
    ALGORITHMS.remove(name)


def get_algorithm(name: str) -> Algorithm:
    """Look up an algorithm, importing it if it is not yet; the error lists the valid names."""
    if name not in ALGORITHMS:
        valid = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown algorithm {name!r}; valid: {valid}")
    return ALGORITHMS[name]

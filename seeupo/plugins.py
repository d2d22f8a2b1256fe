"""Loading user plugins: a Python file or module whose decorators register algorithm pieces or environments.

A plugin is ordinary Python that calls :func:`seeupo.core.registry.register_adv_est` (or the
other ``register_*`` decorators, :func:`seeupo.llm.envs.register_env` for a language-model
environment) at import time. ``seeupo train --plugin my_est.py`` and ``plugins: [my_est.py]`` in a
run config import it before the config's algorithm and environment are checked, so a config may
name the plugin's entries (``algorithm.advantage``, ``env.name``, ...).

Each loaded plugin is recorded as ``SPEC@sha256:HEX``: a file's path (relative to the working
directory when the file lies below it, else absolute; a module name for a module) and the SHA-256
of its content. A run saves its plugins in that form,
so resuming with an edited plugin is refused by the usual config comparison, and a spec given in
that form is checked against the file before it is imported.

Installed packages offer plugins through the entry-point group :data:`ENTRY_POINT_GROUP`
(``seeupo.plugins``): in the package's ``pyproject.toml``::

    [project.entry-points."seeupo.plugins"]
    my_algorithms = "my_package.algorithms"

Every command that reads an algorithm loads them before its own ``--plugin`` files
(:func:`entry_point_plugins`), and records them like the others.

Errors: a missing file or module is one line (:class:`~seeupo.validation.errors.InputError`, exit 2);
a name already registered (a built-in or another plugin) is one line naming both; an exception
raised by the plugin's own code propagates with its traceback, since it is the author's bug to see.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seeupo.validation.errors import InputError

HASH_TAG = "@sha256:"


@dataclass(frozen=True)
class LoadedPlugin:
    """What was imported: ``name`` (a file's path, relative to the working directory when below it, or a
    module name) and the SHA-256 of its source."""

    name: str
    sha256: str

    @property
    def spec(self) -> str:
        """The form saved in a run's config: ``NAME@sha256:HEX``."""
        return f"{self.name}{HASH_TAG}{self.sha256}"


# file path or module name -> the plugin loaded under it, so that loading it again is a no-op
_LOADED: dict[str, LoadedPlugin] = {}
# file path or module name -> what its import registered: (registry field, or "preset"; name)
_REGISTERED: dict[str, list[tuple[str, str]]] = {}
# module plugins whose registrations forget_plugins() undid (a module already imported is otherwise left alone)
_FORGOTTEN: set[str] = set()


def load_plugin(spec: str, field: str = "--plugin") -> LoadedPlugin:
    """Import the plugin ``spec`` (a ``.py`` path or an importable module name, optionally
    ``...@sha256:HEX``) once per process; ``field`` names where it came from in error messages."""
    if not isinstance(spec, str) or not spec.strip():
        raise _error(field, f"must be a path to a .py file or a module name, got {spec!r}")
    target, _, pinned = spec.partition(HASH_TAG)
    path = Path(target).expanduser()
    is_file = target.endswith(".py") or "/" in target or "\\" in target or path.is_file()
    if is_file:
        if not path.is_file():
            raise _error(field, f"no plugin file {target!r}")
        if path.suffix != ".py":  # importlib has no loader for other suffixes
            raise _error(field, f"plugin file {target!r} must be a .py file")
        path = path.resolve()
        key, digest = str(path), _sha256(path)
    else:
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise _error(field, f"no plugin file or importable module {target!r}")
        key, origin = target, found.origin
        digest = _module_sha256(Path(origin)) if origin and Path(origin).is_file() else ""
    if pinned and pinned != digest:
        raise _error(field, f"plugin {key} has changed since it was recorded (sha256 {pinned[:12]}... recorded, "
                                f"{digest[:12]}... now)")
    loaded = _LOADED.get(key)
    if loaded is not None:
        if loaded.sha256 != digest:
            raise _error(field, f"plugin {key} changed after it was loaded in this process; start a new process")
        return loaded
    _import(key, path if is_file else None, field)
    _LOADED[key] = LoadedPlugin(_shown(key) if is_file else key, digest)
    return _LOADED[key]


def loaded_plugins() -> tuple[LoadedPlugin, ...]:
    """The plugins loaded in this process so far, in load order."""
    return tuple(_LOADED.values())


def load_plugins(specs: list[str] | tuple[str, ...], field: str) -> tuple[str, ...]:
    """Load each of ``specs`` (see :func:`load_plugin`); their recorded forms, in order, without repeats."""
    if not isinstance(specs, (list, tuple)):
        raise _error(field, f"must be a list of plugin files or modules, got {type(specs).__name__}")
    out: list[str] = []
    for i, spec in enumerate(specs):
        recorded = load_plugin(spec, f"{field}[{i}]" if field.startswith("config") else field).spec
        if recorded not in out:
            out.append(recorded)
    return tuple(out)


def _import(key: str, path: Path | None, field: str) -> None:
    """Import the plugin; on any failure, undo the registrations it made so that the process stays usable."""
    from seeupo.core.config import PRESETS
    from seeupo.core.registry import NameClash

    registries = _registries()
    before = [set(r.names()) for r in registries]
    presets_before = set(PRESETS)
    module_name = key
    try:
        if path is None:
            if key in _FORGOTTEN:  # imported before, then forgotten: import it afresh so that it registers again
                sys.modules.pop(key, None)
                _FORGOTTEN.discard(key)
            importlib.import_module(key)
        else:
            # a unique module name per file: two plugins both called est.py must not replace each other
            module_name = f"seeupo_plugin_{hashlib.sha256(key.encode()).hexdigest()[:12]}_{path.stem}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    except BaseException as err:
        for registry, names in zip(registries, before):
            for name in set(registry.names()) - names:
                registry.remove(name)
        for name in set(PRESETS) - presets_before:
            del PRESETS[name]
        if path is not None:
            sys.modules.pop(module_name, None)
        if isinstance(err, NameClash):
            raise _error(field, f"plugin {key}: {err}") from None
        if isinstance(err, Exception):  # the user's code failed: one line, with where in their code
            from seeupo.core.boundary import user_frames

            at = user_frames(err)
            raise _error(field, f"plugin {_shown(key)} failed to import: {type(err).__name__}: {err}"
                                + (f" (at {at})" if at else "")) from None
        raise
    _REGISTERED[key] = [(r.field, name) for r, names in zip(registries, before) for name in set(r.names()) - names]
    _REGISTERED[key] += [("preset", name) for name in set(PRESETS) - presets_before]


def forget_plugins() -> None:
    """Unregister everything the loaded plugins registered and forget them, as in a new process
    (tests, and interactive sessions that edit a plugin and load it again)."""
    from seeupo.core.config import PRESETS

    by_field = {r.field: r for r in _registries()}
    for added in _REGISTERED.values():
        for field, name in added:
            if field == "preset":
                PRESETS.pop(name, None)
            elif name in by_field[field]:
                by_field[field].remove(name)
    _FORGOTTEN.update(key for key in _LOADED if not Path(key).is_absolute())  # file plugins are keyed by absolute path
    _REGISTERED.clear()
    _LOADED.clear()


def _registries() -> tuple[Any, ...]:
    """Every registry a plugin may add to: the algorithm pieces' and the environments'."""
    from seeupo.core.config import REGISTRIES
    from seeupo.llm.envs import ENVIRONMENTS

    return (*REGISTRIES, ENVIRONMENTS)


def _shown(path: str) -> str:
    """A plugin file as recorded: relative to the working directory when it lies below it (so that a
    report committed with the project names no machine's folders), else absolute."""
    try:
        return str(Path(path).relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def _error(field: str, message: str) -> InputError:
    """A flag reads as argparse words it (``argument --plugin: ...``), a config field as the other config errors."""
    return InputError(None, f"argument {field}: {message}") if field.startswith("--") else InputError(field, message)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _module_sha256(origin: Path) -> str:
    """A module's hash: its file's, or for a package (``__init__.py``) that of every ``.py`` file
    under its folder (relative names and contents), so that an edit anywhere in it is seen."""
    if origin.name != "__init__.py":
        return _sha256(origin)
    digest = hashlib.sha256()
    for file in sorted(origin.parent.rglob("*.py")):
        digest.update(str(file.relative_to(origin.parent)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


ENTRY_POINT_GROUP = "seeupo.plugins"


def entry_point_plugins() -> list[str]:
    """The modules that installed packages offer as plugins (entry-point group ``seeupo.plugins``), sorted by name.

    An entry point's value is a module (``pkg.mod``) or an object in one (``pkg.mod:obj``); the
    module is the plugin. Nothing is imported here: the commands load them with their ``--plugin`` files.
    """
    from importlib.metadata import entry_points

    return [ep.value.partition(":")[0].strip() for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)]

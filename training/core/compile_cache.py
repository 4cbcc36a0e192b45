"""JAX's persistent compilation cache for a run, and a count of what the run compiled.

Every bucket shape is its own XLA program; without a persistent cache a resumed run, a second
sweep point and eval.py compile them all again. `enable` points JAX at the cache named by
`config.compilation_cache_dir` and caches every program, however small or quick to compile
(JAX's defaults skip programs compiled in under a second, which is most of them on a CPU).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

# JAX's events: every XLA compile-or-load of a program (a cache load included), and a load's hit.
_PROGRAM_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def cache_dir(setting: str) -> Path | None:
    """The directory `config.compilation_cache_dir` names (None: '', no cache of ours).

    'auto': JAX's own setting where one is made (JAX_COMPILATION_CACHE_DIR, or a test session's),
    else $XDG_CACHE_HOME/headcount/jax, else ~/.cache/headcount/jax.
    """
    if not setting:
        return None
    if setting == "auto":
        if jax.config.jax_compilation_cache_dir:
            return Path(jax.config.jax_compilation_cache_dir)
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "headcount" / "jax"
    return Path(setting).expanduser()


def check_setting(setting) -> None:
    """ValueError unless `setting` is '', 'auto' or a path that is not a file."""
    if not isinstance(setting, str) or (setting not in ("", "auto") and Path(setting).expanduser().is_file()):
        raise ValueError(
            f"config.compilation_cache_dir = {setting!r}; expected 'auto', '' (no cache) or a directory path"
        )


def enable(setting: str, name: str = "config.compilation_cache_dir") -> Path | None:
    """Use the cache `setting` names for every compile from now on, in this process; returns its directory.

    name: where the setting came from, for the error (eval.py and analyze.py pass their --compilation_cache_dir).
    """
    directory = cache_dir(setting)
    if directory is None:
        logging.info("persistent compilation cache: off (%s '')", name)
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(directory))
    except OSError as error:
        raise ValueError(
            f"{name} = {setting!r}: {directory} cannot be used "
            f"({error.strerror or error}); expected a writable directory, or '' for no cache"
        ) from None
    if jax.config.jax_compilation_cache_dir != str(directory):
        compilation_cache.set_cache_dir(str(directory))
        compilation_cache.reset_cache()  # JAX opens its cache once a process; make it open this one
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no size floor
    logging.info("persistent compilation cache: %s", directory)
    return directory


class CompileCounter:
    """Programs XLA compiled and programs loaded from the persistent cache while it is entered, with their seconds.

    JAX reports both as one event (`_PROGRAM_EVENT`); a load is the one preceded, in its own thread,
    by a cache hit.
    """

    def __init__(self):
        self.compiled, self.compile_s, self.loaded, self.load_s = 0, 0.0, 0, 0.0
        self._hit = threading.local()

    def __enter__(self) -> CompileCounter:
        jax.monitoring.register_event_listener(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_listener(self._on_event)
        jax.monitoring.unregister_event_duration_listener(self._on_duration)

    def _on_event(self, event: str, **kwargs) -> None:
        if event == _HIT_EVENT:
            self._hit.pending = True

    def _on_duration(self, event: str, seconds: float, **kwargs) -> None:
        if event != _PROGRAM_EVENT:
            return
        if getattr(self._hit, "pending", False):
            self._hit.pending = False
            self.loaded, self.load_s = self.loaded + 1, self.load_s + seconds
        else:
            self.compiled, self.compile_s = self.compiled + 1, self.compile_s + seconds

    def totals(self) -> dict:
        return {
            "compiled": self.compiled,
            "compile_s": self.compile_s,
            "cache_loaded": self.loaded,
            "cache_load_s": self.load_s,
        }

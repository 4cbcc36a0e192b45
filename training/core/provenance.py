"""What a result was computed with: the releases behind its numbers and the lock they were meant to come from.

Every stored run (`sweeps/point_run.py`'s result.json) and the bench scripts' outputs carry `environment()`, so
that a figure can be traced to the exact jax, jaxlib, flax, optax and orbax releases, and to the
`requirements.lock` of the checkout that produced it. Standard library only.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")  # the releases a figure depends on
LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"  # the checkout's lock (absent in a wheel)


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """{package: installed version, None where it is not installed}."""
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def pins(lock_text: str) -> dict[str, str]:
    """{normalised name: version} of a lock's `name==version` lines (markers and comments ignored)."""
    found = {}
    for line in lock_text.splitlines():
        if match := re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line):
            found[_normalise(match[1])] = match[2]
    return found


def environment(lock: Path = LOCK) -> dict:
    """The installed releases of `PACKAGES`, the lock's SHA-256 (None without one) and which of the
    packages differ from the lock's pins (a venv not installed from it): a result's provenance."""
    installed = versions()
    text = lock.read_text() if lock.is_file() else None
    pinned = pins(text) if text is not None else {}
    return {
        "versions": installed,
        "lock_sha256": hashlib.sha256(text.encode()).hexdigest() if text is not None else None,
        "off_lock": sorted(
            name for name, version in installed.items() if text is not None and pinned.get(_normalise(name)) != version
        ),
    }


def describe(env: dict | None = None) -> str:
    """One line for a table's header: 'jax 0.12.1, jaxlib 0.12.1, ... ; requirements.lock 1a2b3c4d5e6f'."""
    env = environment() if env is None else env
    releases = ", ".join(f"{name} {version or 'absent'}" for name, version in env["versions"].items())
    lock = f"requirements.lock {env['lock_sha256'][:12]}" if env["lock_sha256"] else "no requirements.lock"
    off = f" (off the lock: {', '.join(env['off_lock'])})" if env["off_lock"] else ""
    return f"{releases}; {lock}{off}"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def git_commit() -> dict:
    """The commit this code runs on, and whether its tracked files differ from it ({} outside a git checkout)."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=LOCK.parent, capture_output=True, text=True, timeout=30)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return {}
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
    return {"commit": head.stdout.strip(), "dirty": dirty}

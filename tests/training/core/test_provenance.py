"""`training.core.provenance`: the releases and the lock a result records."""

import hashlib
import os
from importlib import metadata

import pytest

from training.core import provenance

LOCK = """# a comment
jax==0.12.1
    # via headcount
jaxlib==0.12.1 ; sys_platform == 'linux'
Flax==0.0.1
orbax_checkpoint==9.9
"""


def test_pins_reads_name_version_lines_and_normalises_names():
    assert provenance.pins(LOCK) == {"jax": "0.12.1", "jaxlib": "0.12.1", "flax": "0.0.1", "orbax-checkpoint": "9.9"}


def test_environment_names_the_installed_releases_the_lock_hash_and_what_is_off_the_lock(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK)
    env = provenance.environment(lock)
    assert env["versions"]["jax"] == metadata.version("jax")
    assert env["lock_sha256"] == hashlib.sha256(LOCK.encode()).hexdigest()
    # flax and orbax pinned to releases that are not installed; optax not pinned at all
    assert {"flax", "optax", "orbax-checkpoint"} <= set(env["off_lock"])
    assert ("jax" in env["off_lock"]) == (metadata.version("jax") != "0.12.1")
    assert "requirements.lock " + env["lock_sha256"][:12] in provenance.describe(env)


def test_without_a_lock_nothing_is_called_off_it(tmp_path):
    env = provenance.environment(tmp_path / "absent.lock")
    assert env["lock_sha256"] is None and env["off_lock"] == []
    assert provenance.describe(env).endswith("; no requirements.lock")


@pytest.mark.skipif(os.environ.get("HEADCOUNT_UNLOCKED") == "1", reason=".ci/latest installs off the lock on purpose")
def test_the_checkout_is_installed_from_its_own_lock():
    """What the README installs is what the results name: this venv's releases match requirements.lock."""
    env = provenance.environment()
    assert env["lock_sha256"] is not None, "requirements.lock is missing from the checkout"
    assert env["off_lock"] == [], f"installed off requirements.lock: {env['versions']}"

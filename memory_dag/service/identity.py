"""Who is calling the service: API keys, each bound to an agent (and optionally one user).

    # MEMORY_DAG_API_KEYS=keys.yaml
    keys:
      mk-alice-assistant: {agent: supervisor, user: alice}   # reads and writes as alice only
      mk-planner: {agent: planner}                            # any user the request names

The agent is the allowlist identity of seed 003 §5 (`categories.yaml`): it comes from the key,
never from a request body. A key bound to a user acts for that user only; a request naming
another one is refused. A request without a valid key is refused (401) when keys are
configured. Without keys the service runs open, only on a loopback address (`check_bind`), as
the identity `memory-dag serve --agent/--user` gives (default: an operator who reads all).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memory_dag.memories.categories import AccessDenied, load_categories

#: Headers a key may come in (the OpenAI client sends `Authorization: Bearer <key>`).
KEY_HEADER = "x-memory-api-key"


class ServiceConfigError(ValueError):
    """The service cannot start as configured (a bad key file, an open public address)."""


@dataclass(frozen=True)
class Identity:
    """The caller: its agent (allowlist) and the user it is bound to (None: any it names)."""

    agent: str | None = None
    user_id: str | None = None
    #: Whether the key came in `Authorization` (then it is not forwarded upstream).
    via_authorization: bool = False

    def user(self, requested: str | None) -> str | None:
        """The user a request acts for: the key's; a request naming another is AccessDenied."""
        if self.user_id is None:
            return requested or None
        if requested not in (None, "", self.user_id):
            raise AccessDenied(f"this key acts for user {self.user_id!r}, not {requested!r}")
        return self.user_id


class ApiKeys:
    """The key file, loaded once: key -> Identity."""

    def __init__(self, keys: Mapping[str, Identity]) -> None:
        self._keys = dict(keys)

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        """Read a key file; ServiceConfigError names what is wrong (unknown agents too)."""
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ServiceConfigError(f"cannot read the API key file {path}: {error}") from error
        entries = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not entries:
            raise ServiceConfigError(f"{path}: expected `keys:` mapping each key to an agent")
        agents = set(load_categories().allowlists)
        keys: dict[str, Identity] = {}
        for key, entry in entries.items():
            keys[str(key)] = _identity(str(key), entry, agents, path)
        return cls(keys)

    def identify(self, token: str | None) -> Identity | None:
        """The identity of a key (compared in constant time), or None."""
        if not token:
            return None
        found = None
        for key, identity in self._keys.items():
            if hmac.compare_digest(key.encode(), token.encode()):
                found = identity
        return found


def _identity(key: str, entry: Any, agents: set[str], path: str | Path) -> Identity:
    if len(key) < 8:
        raise ServiceConfigError(f"{path}: keys must be at least 8 characters")
    if not isinstance(entry, dict) or not isinstance(entry.get("agent"), str):
        raise ServiceConfigError(f"{path}: key {key[:4]}…: give it an `agent`")
    agent = entry["agent"]
    if agent not in agents:
        raise ServiceConfigError(
            f"{path}: agent {agent!r} has no allowlist in categories.yaml "
            f"(agents: {', '.join(sorted(agents))})"
        )
    user = entry.get("user")
    return Identity(agent=agent, user_id=str(user) if user is not None else None)


def token_of(headers: Mapping[str, str]) -> tuple[str | None, bool]:
    """(the key a request carries, whether it came in `Authorization`)."""
    explicit = headers.get(KEY_HEADER)
    if explicit:
        return explicit.strip(), False
    authorization = headers.get("authorization") or ""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), True
    return None, False


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts local connections."""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: ApiKeys | None) -> None:
    """Refuse to serve a non-loopback address without API keys."""
    if keys is None and not is_loopback(host):
        raise ServiceConfigError(
            f"refusing to listen on {host} without API keys: set MEMORY_DAG_API_KEYS to a key "
            "file (see memory_dag/service/identity.py), or listen on 127.0.0.1"
        )

"""Where gpuprov keeps its state and finds its Ansible content."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from gpuprov.errors import BadInput, GpuprovError

_PKG = Path(__file__).resolve().parent


def home() -> Path:
    """The state directory: ``GPUPROV_HOME``, else the user state dir."""
    env = os.environ.get("GPUPROV_HOME")
    if env:
        path = Path(env).expanduser()
    else:
        from platformdirs import user_state_path

        path = user_state_path("gpuprov", appauthor=False)
    if any(c in str(path) for c in "\n\r\0"):
        raise BadInput(f"GPUPROV_HOME {str(path)!r}: a state directory path has no newlines")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise GpuprovError(f"state directory {path} cannot be created ({exc.strerror}); "
                           "set GPUPROV_HOME to a directory you can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise GpuprovError(f"state directory {path} is not writable; fix its permissions or set "
                           "GPUPROV_HOME to a directory you can write")
    _own_only(path)
    return path


def _own_only(path: Path) -> None:
    """The state directory holds SSH keys and the cluster records: found open to others (0755),
    it is made 0700 and the database files 0600; where that cannot be done, it is refused."""
    for each, mode in [(path, 0o700)] + [(f, 0o600) for f in sorted(path.glob("state.db*")) if f.is_file()]:
        found = each.stat().st_mode & 0o777
        if found & 0o077:
            try:
                os.chmod(each, mode)
            except OSError as exc:
                raise GpuprovError(f"{each} is open to other users (mode {found:04o}) and cannot be made "
                                   f"{mode:04o} ({exc.strerror}); make it so, or set GPUPROV_HOME to a "
                                   "directory of your own") from None


def cluster_dir(name: str, create: bool = True) -> Path:
    path = home() / "clusters" / name
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _content_root() -> Path:
    # A source checkout keeps roles/ playbooks/ templates/ beside the package;
    # an installed wheel carries them under gpuprov/share/.
    checkout = _PKG.parent
    if (checkout / "roles").is_dir() and (checkout / "playbooks").is_dir():
        return checkout
    return _PKG / "share"


def roles_dir() -> Path:
    return _content_root() / "roles"


def role_module(name: str, *parts: str) -> ModuleType:
    """A Python file a role ships (standard library only, so the role needs nothing of gpuprov),
    loaded as the module ``name`` from the roles directory gpuprov uses: ``parts`` is its path
    there (role, folder, file). gpuprov calls the very code the role runs. Not cached: callers
    load it once."""
    path = roles_dir().joinpath(*parts)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise BadInput(f"a role's program is missing: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by its name
    spec.loader.exec_module(module)
    return module


def playbooks_dir() -> Path:
    return _content_root() / "playbooks"


def templates_dir() -> Path:
    return _content_root() / "templates"


def probes_dir() -> Path:
    return _PKG / "probes"


def config_path() -> Path:
    """The settings file: ``GPUPROV_CONFIG``, else settings.toml in the user config dir."""
    env = os.environ.get("GPUPROV_CONFIG")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_path

    return user_config_path("gpuprov", appauthor=False) / "settings.toml"


def machine_setting(key: str, env: str) -> tuple[str, str]:
    """A setting of this machine's (``state``, ``identity``), never a cluster's: (its value,
    where it was read) from environment variable ``env`` where set, else from the settings
    file's string ``key`` ("" where it has none)."""
    import tomllib  # lazy: CLI start-up (only the commands that read the settings file)

    if env in os.environ:
        return os.environ[env], env
    path = config_path()
    try:
        raw = tomllib.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"settings file {path} is not valid TOML ({exc})") from None
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise BadInput(f"settings file {path}: {key} must be a string, not {value!r}")
    return value, f"settings file {path}: {key}"

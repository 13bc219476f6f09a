"""The fusion cache folder: where compiled kernels and plans live, and whether its code may run.

ember runs code from this folder: the kernel modules it generates (``k_*.py``,
``parallel/p_*.py``, ``triton/t_*.py``) and the machine code numba keeps beside them in
``__pycache__``, whose index files numba reads with ``pickle``. A folder that another
user can write into would let them run code in every process that uses fusion (a folder
under ``/tmp`` made by someone else first, a group-writable shared cache). So before a
module is imported from it, the folder is checked the way OpenSSH checks ``~/.ssh``:

* the folder and every folder above it belong to this user or to root, and none of them
  can be written by other users, except a folder *above* the cache folder with the
  sticky bit (``/tmp``: only an entry's owner can rename or remove it);
* the ``__pycache__`` folder beside the module, every file in it, and the module file
  itself belong to this user or root and can be written by no other user;
* with ``NUMBA_CACHE_DIR`` set, numba keeps its machine code there instead: that folder
  and those above it are checked the same way;
* Triton's compiled binaries (``triton/compiled``, where Triton also keeps the launcher
  modules it imports) are checked as a whole tree.

"Other users" are others and the group, unless the group is this user's own private
group (named after the user, the user's primary group, no other members), as Debian and
Ubuntu make one for each user, with a umask of 002 that leaves folders group-writable.

A folder that fails raises :class:`~ember.backend.errors.UnsafeCacheError`, naming the
path, its owner and its mode; nothing from it has been imported. Folders ember makes are
private (mode 0o700). A folder passes once per process (its ``__pycache__`` is listed
then); each module file is checked when it is imported. On systems without POSIX owners
(Windows) there is nothing to check: the folder's access rights are the user's to keep.

The folder is ``EMBER_FUSION_CACHE``, else ``$XDG_CACHE_HOME/ember/fusion``
(``~/.cache/ember/fusion``). This module imports nothing heavy (not numba): the plan
cache reads the folder from here too.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> private = Path(tempfile.mkdtemp())
    >>> code_folder(private / "kernels") == private / "kernels"
    True
"""

from __future__ import annotations

import functools
import os
import stat
import threading
from pathlib import Path

from ember.backend.errors import ConfigError, UnsafeCacheError

__all__ = ["cache_dir", "check_module", "code_folder", "forget"]

_PRIVATE = 0o700
_checked: set[Path] = set()  # folders that passed in this process
_lock = threading.Lock()


def cache_dir() -> Path:
    """The fusion cache folder (module doc), not checked: :func:`code_folder` checks it."""
    configured = os.environ.get("EMBER_FUSION_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ember" / "fusion"


def code_folder(folder: str | os.PathLike, tree: bool = False) -> Path:
    """``folder`` (made private where missing) once it is safe to import code from;
    ``tree``: every folder and file below it is checked too (Triton's compiled binaries,
    whose launchers it loads as modules), not only ``__pycache__``.

    Raises:
        UnsafeCacheError: the folder, a folder above it, its ``__pycache__`` or a file
            there (anything below it, with ``tree``) can be written by another user
            (module doc).
        ConfigError: the folder cannot be made (a file in its place, no permission).
    """
    folder = Path(folder)
    try:  # each time: it may have been removed
        folder.mkdir(mode=_PRIVATE, parents=True, exist_ok=True)
    except OSError as error:  # a file in the way, a read-only place, no permission
        raise ConfigError(f"fusion: the kernel cache folder {folder} cannot be made "
                          f"({error.strerror}: {error.filename}); choose another folder "
                          "with EMBER_FUSION_CACHE", file=str(folder)) from None  # fmt: skip
    _passed(folder, tree)
    return folder


def check_module(path: str | os.PathLike) -> Path:
    """``path``, a module file in a cache folder, once its folder passes :func:`code_folder`
    and the file itself belongs to this user or root and is writable by no one else.

    Raises:
        UnsafeCacheError: as :func:`code_folder`, or for the file.
    """
    path = Path(path)
    _passed(path.parent)  # the file exists: so does its folder
    if _owners_apply():
        _check_entry(path, os.stat(path))
    return path


def forget() -> None:
    """Checks every folder again on its next use (tests; a folder whose rights changed)."""
    with _lock:
        _checked.clear()


# ---------------------------------------------------------------------- the checks
def _passed(folder: Path, tree: bool = False) -> None:
    """Checks ``folder`` (an existing one) unless it passed in this process (module doc)."""
    if folder in _checked:
        return
    with _lock:
        if _owners_apply():
            _check_chain(folder.resolve())
            if tree:
                _check_below(folder)
            else:
                _check_cache_of(folder)
        _checked.add(folder)


def _owners_apply() -> bool:
    return hasattr(os, "geteuid")


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


@functools.lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's own (module doc): no one else can write
    through it."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except KeyError:  # an id without a name: nothing says whose it is
        return False
    return (gid == user.pw_gid and group.gr_name == user.pw_name
            and all(member == user.pw_name for member in group.gr_mem))  # fmt: skip


def _check_chain(folder: Path, role: str = "the kernel cache folder") -> None:
    """The resolved ``folder`` and every folder above it (module doc)."""
    _check_entry(folder, os.stat(folder), role)
    for above in folder.parents:
        info = os.stat(above)
        if info.st_mode & stat.S_ISVTX and _trusted_owner(info.st_uid):
            continue  # /tmp: others write there, but cannot move what is ours
        _check_entry(above, info, "a folder above the kernel cache")


def _check_cache_of(folder: Path) -> None:
    """numba's machine code for modules in ``folder``: ``__pycache__`` and its files, or the
    ``NUMBA_CACHE_DIR`` folder (numba reads it from the environment when it loads)."""
    numba_dir = os.environ.get("NUMBA_CACHE_DIR")
    if numba_dir:
        if os.path.isdir(numba_dir):
            _check_chain(Path(numba_dir).resolve(), "numba's cache folder, NUMBA_CACHE_DIR")
        return
    cache = folder / "__pycache__"
    try:
        info = os.stat(cache)
    except FileNotFoundError:
        return
    _check_entry(cache, info)
    _check_below(cache)


def _check_below(folder: Path) -> None:
    """Every entry below ``folder``, folders first (links are judged by their targets and
    not followed into)."""
    pending = [folder]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                try:
                    info = entry.stat()
                except FileNotFoundError:  # replaced meanwhile (numba writes by renaming),
                    continue  # or a link to nothing: nothing a loader could read
                _check_entry(Path(entry.path), info)
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))


_WRITERS = ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others"))


def _check_entry(path: Path, info: os.stat_result, role: str = "") -> None:
    if not _trusted_owner(info.st_uid):
        problem = f"belongs to user id {info.st_uid}, not to this user ({os.geteuid()})"
    elif writers := [who for bit, who in _WRITERS if info.st_mode & bit
                     and not (bit == stat.S_IWGRP and _private_group(info.st_gid))]:
        mode = stat.S_IMODE(info.st_mode)
        problem = f"can be written by {' and '.join(writers)} (mode {mode:#o})"
    else:
        return
    what = role or ("a folder" if stat.S_ISDIR(info.st_mode) else "a file") + " in the kernel cache"
    raise UnsafeCacheError(
        f"fusion: {path} ({what}) {problem}; ember runs compiled code from the kernel "
        "cache, so it will not use this one. Make it private (chmod go-w, owned by you) or "
        "choose another folder with EMBER_FUSION_CACHE",
        file=str(path),
    )

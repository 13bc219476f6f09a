"""The kernel cache folder holds code ember runs: it is used only while no other user can
write it, the folders above it, numba's files in it or the module being imported. The
refusals are tested with the modes and owners an attacker would leave, and end to end with
a pickle planted where numba reads its index: refused when others could have written it,
and shown to run when the same file is trusted (which is why the check exists)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from ember.backend.errors import ConfigError, UnsafeCacheError
from ember.backends.fusion import cache_folder
from ember.backends.fusion.cache_folder import cache_dir, check_module, code_folder

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="no POSIX owners to check")

PRIVATE_GROUP = cache_folder._private_group.__wrapped__  # before the fixture replaces it


@pytest.fixture(autouse=True)
def _fresh_checks(monkeypatch):
    """Every folder is checked anew in each test, and no test leaves a folder passed. Its
    files' group is taken as shared with other users (as a group-writable folder of a
    team's would be) unless a test says otherwise: this user's private group may write."""
    cache_folder.forget()
    monkeypatch.setattr(cache_folder, "_private_group", lambda gid: False)
    yield
    cache_folder.forget()


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A folder only this user can write, under pytest's private temporary folder."""
    tmp_path.chmod(0o700)
    return tmp_path


def _refused(folder_or_file: Path, check=code_folder) -> UnsafeCacheError:
    with pytest.raises(UnsafeCacheError) as caught:
        check(folder_or_file)
    return caught.value


@pytest.mark.parametrize("env, expected", [({"EMBER_FUSION_CACHE": "/x/y"}, "/x/y"),
                                           ({"XDG_CACHE_HOME": "/z"}, "/z/ember/fusion"),
                                           ({}, "~/.cache/ember/fusion")])  # fmt: skip
def test_the_folder_follows_the_environment(env, expected, monkeypatch):
    for name in ("EMBER_FUSION_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cache_dir() == Path(expected).expanduser()


def test_a_missing_folder_is_made_private(private):
    folder = private / "a" / "kernels"
    assert code_folder(folder) == folder
    assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_a_folder_that_cannot_be_made_is_a_config_error(private, where):
    blocker = private / "kernels"
    blocker.write_text("not a folder")
    folder = blocker if where == "file" else blocker / "sub"
    with pytest.raises(ConfigError) as caught:
        code_folder(folder)
    assert not isinstance(caught.value, UnsafeCacheError) and caught.value.file == str(folder)
    assert f"the kernel cache folder {folder} cannot be made (" in str(caught.value)
    assert str(blocker) in str(caught.value) and "EMBER_FUSION_CACHE" in str(caught.value)


def test_a_folder_removed_while_the_process_runs_is_made_again(private):
    folder = code_folder(private / "kernels")
    folder.rmdir()  # a user clearing the cache
    assert code_folder(folder) == folder
    assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode, writers", [(0o770, "its group"), (0o707, "others"),
                                           (0o777, "its group and others")])  # fmt: skip
def test_a_folder_others_can_write_is_refused(private, mode, writers):
    folder = private / "kernels"
    folder.mkdir()
    folder.chmod(mode)
    error = _refused(folder)
    assert isinstance(error, ConfigError) and error.file == str(folder)
    assert f"{folder} (the kernel cache folder) can be written by {writers}" in str(error)
    assert f"mode {mode:#o}" in str(error) and "EMBER_FUSION_CACHE" in str(error)
    folder.chmod(0o755)
    assert code_folder(folder) == folder  # a refused folder is checked again, not remembered


def test_a_folder_above_others_can_write_is_refused_unless_sticky(private):
    shared = private / "shared"
    folder = shared / "mine" / "kernels"
    folder.mkdir(parents=True)
    shared.chmod(0o777)  # another user could rename "mine" and put their own in its place
    error = _refused(folder)
    assert f"{shared} (a folder above the kernel cache) can be written by its group" in str(error)
    shared.chmod(0o1777)  # like /tmp: only an entry's owner may rename or remove it
    assert code_folder(folder) == folder


def test_the_cache_folder_itself_must_not_rely_on_a_sticky_bit(private):
    folder = private / "kernels"
    folder.mkdir()
    folder.chmod(0o1777)  # others can still add files numba would read
    assert "(the kernel cache folder)" in str(_refused(folder))


def _with_numba_folder(private: Path) -> tuple[Path, Path]:
    """A cache folder and the ``__pycache__`` where numba keeps its machine code."""
    folder = private / "kernels"
    (folder / "__pycache__").mkdir(parents=True)
    return folder, folder / "__pycache__"


def test_numbas_files_are_checked(private):
    folder, numba_files = _with_numba_folder(private)
    index = numba_files / "k_0.kernel-1.py311.nbi"
    index.write_bytes(b"")
    index.chmod(0o646)
    error = _refused(folder)
    assert f"{index} (a file in the kernel cache) can be written by others" in str(error)
    index.chmod(0o644)
    numba_files.chmod(0o777)
    assert f"{numba_files} (a folder in the kernel cache)" in str(_refused(folder))
    numba_files.chmod(0o755)
    assert code_folder(folder) == folder


def test_a_link_in_numbas_folder_is_judged_by_its_target(private):
    folder, numba_files = _with_numba_folder(private)
    target = private / "elsewhere.nbi"
    target.write_bytes(b"")
    target.chmod(0o666)
    link = numba_files / "k_0.kernel-1.py311.nbi"
    link.symlink_to(target)
    (numba_files / "k_1.kernel-1.py311.nbi").symlink_to(private / "nothing")  # unreadable
    assert f"{link} (a file in the kernel cache) can be written by" in str(_refused(folder))
    target.chmod(0o644)
    assert code_folder(folder) == folder


def test_a_tree_is_checked_all_the_way_down(private):
    folder = private / "compiled"
    deep = folder / "a1b2" / "c3"
    deep.mkdir(parents=True)
    launcher = deep / "launcher.so"
    launcher.write_bytes(b"")
    launcher.chmod(0o646)
    assert code_folder(folder) == folder  # only __pycache__ is listed by default
    cache_folder.forget()
    assert f"{launcher} (a file in the kernel cache) can be written by others" in str(
        _refused(folder, lambda f: code_folder(f, tree=True)))
    launcher.chmod(0o644)
    (folder / "a1b2").chmod(0o777)
    assert f"{folder / 'a1b2'} (a folder in the kernel cache)" in str(
        _refused(folder, lambda f: code_folder(f, tree=True)))
    (folder / "a1b2").chmod(0o755)
    assert code_folder(folder, tree=True) == folder


def test_the_module_file_is_checked(private):
    folder = code_folder(private / "kernels")
    module = folder / "k_0.py"
    module.write_text("x = 1\n")
    module.chmod(0o664)
    assert f"{module} (a file in the kernel cache) can be written by its group" in str(
        _refused(module, check_module))
    module.chmod(0o644)
    assert check_module(module) == module


def test_a_linked_cache_folder_is_judged_where_it_lies(private):
    shared = private / "shared"
    (shared / "real").mkdir(parents=True)
    shared.chmod(0o777)
    link = private / "kernels"
    link.symlink_to(shared / "real")
    assert f"{shared} (a folder above the kernel cache)" in str(_refused(link))
    shared.chmod(0o755)
    assert code_folder(link) == link


def test_numba_cache_dir_is_checked_where_numba_keeps_the_code(private, monkeypatch):
    numba_dir = private / "numba"
    numba_dir.mkdir()
    numba_dir.chmod(0o775)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(numba_dir))
    error = _refused(private / "kernels")
    assert f"{numba_dir} (numba's cache folder, NUMBA_CACHE_DIR)" in str(error)


def test_a_folder_of_another_user_is_refused(private, monkeypatch):
    folder = private / "kernels"
    folder.mkdir()
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)  # nobody's
        owner = 65534
    else:  # without root no file can be given away: this process plays another user
        owner = os.geteuid()
        monkeypatch.setattr(cache_folder.os, "geteuid", lambda: owner + 1)
    error = _refused(folder)
    assert f"{folder} (the kernel cache folder) belongs to user id {owner}" in str(error)


def test_the_users_private_group_may_write(private, monkeypatch):
    monkeypatch.setattr(cache_folder, "_private_group", lambda gid: True)  # umask 002
    folder = private / "kernels"
    folder.mkdir()
    folder.chmod(0o775)
    assert code_folder(folder) == folder
    cache_folder.forget()
    folder.chmod(0o777)
    assert "can be written by others (mode 0o777)" in str(_refused(folder))


def test_a_private_group_is_the_users_own_and_no_one_elses():
    import grp
    import pwd

    private_group = PRIVATE_GROUP
    user = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(user.pw_gid)
    own = group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}
    assert private_group(user.pw_gid) is own
    others = [g.gr_gid for g in grp.getgrall() if g.gr_gid != user.pw_gid]
    assert others and not any(private_group(gid) for gid in others)
    unnamed = max(g.gr_gid for g in grp.getgrall()) + 1
    assert private_group(unnamed) is False


def test_the_numba_runtime_refuses_at_construction(private):
    pytest.importorskip("numba")
    from ember.backends.fusion.numba_runtime import NumbaRuntime

    folder = private / "kernels"
    folder.mkdir()
    folder.chmod(0o777)
    assert str(folder) in str(_refused(folder, NumbaRuntime))


# ------------------------------------------------------------ end to end, with a payload
_RUN = """
import numpy as np
import ember
from ember import Tensor

device = ember.device("ndarray").fusion()
x = Tensor.from_data(np.arange(1 << 17, dtype=np.float32) / (1 << 17), device)
print(float(((x * 2.0 + 1.0) * x).sum().into_scalar()))
"""


class _Payload:
    """Unpickled, it opens (creates) the marker file: what numba would run for an attacker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _run(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EMBER_FUSION_CACHE": str(folder), "EMBER_FUSION_AUTOTUNE": "0",
           "EMBER_FUSION_WORKERS": "ember", "EMBER_FUSION_PLANS": "0"}  # fmt: skip
    env.pop("NUMBA_CACHE_DIR", None)
    return subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_a_planted_index_runs_only_where_the_check_would_pass(private):
    pytest.importorskip("numba")
    folder = private / "kernels"
    first = _run(folder)
    assert first.returncode == 0, first.stderr
    indexes = sorted((folder / "__pycache__").glob("k_*.nbi"))
    assert indexes, "numba kept no index for the kernel"
    marker = private / "ran"
    for index in indexes:
        index.write_bytes(pickle.dumps(_Payload(marker)))
        index.chmod(0o666)  # as an attacker with write access would leave it

    refused = _run(folder)
    assert refused.returncode != 0 and "UnsafeCacheError" in refused.stderr
    assert "can be written by" in refused.stderr and "others (mode 0o666)" in refused.stderr
    assert not marker.exists()

    for index in indexes:  # the same bytes, now looking like this user's own file
        index.chmod(0o644)
    trusted = _run(folder)
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout == first.stdout
    assert marker.exists(), "numba did not unpickle the index: the threat this guards against moved"

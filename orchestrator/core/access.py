"""Can a unit's user reach a path? Decided from what `stat` said of every directory on the way (pure).

The kernel checks search (x) on every directory of a path, the symlink's target path included, then the
leaf's own bits: the motivating failure is an engine under /root (0700) for the engines' own user, which systemd
reports only as 203/EXEC once the serving model is already stopped. ACLs are not read: mode bits only.
"""

from __future__ import annotations

import posixpath
import stat
from dataclasses import dataclass
from typing import Literal

Need = Literal["exec", "read", "dir", "rw"]  # an executable, a readable file, a readable folder, a device node
_WHAT = {"exec": "execute (x)", "read": "read (r)", "dir": "read and enter (r-x)", "rw": "read and write (rw)"}


@dataclass(frozen=True)
class Account:
    """A user as the host knows it: the uid and every group id it runs with (id -u, id -G)."""

    name: str
    uid: int
    gids: frozenset[int]


@dataclass(frozen=True)
class PathStat:
    path: str
    mode: int  # st_mode, type bits included (stat -L -c %f)
    uid: int
    gid: int


@dataclass(frozen=True)
class Walk:
    """One target, and what stat said of each path on the way to it (absent: it does not exist);
    ``resolved``: its symlinks resolved (readlink -f), walked too."""

    target: str
    stats: dict[str, PathStat]
    resolved: str | None = None


def prefixes(path: str) -> list[str]:
    """/a/b/c -> ['/', '/a', '/a/b', '/a/b/c']."""
    parts = [p for p in posixpath.normpath(path).split("/") if p]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _allowed(st: PathStat, user: Account, bits: int) -> bool:
    """Whether the mode grants ``bits`` (r=4, w=2, x=1) to the user: owner, else group, else other."""
    if user.uid == 0:  # root passes every check but execute, which needs some x bit
        return not (bits & 1) or bool(st.mode & 0o111) or stat.S_ISDIR(st.mode)
    if st.uid == user.uid:
        granted = (st.mode >> 6) & 7
    elif st.gid in user.gids:
        granted = (st.mode >> 3) & 7
    else:
        granted = st.mode & 7
    return granted & bits == bits


def _show(st: PathStat) -> str:
    return f"{stat.filemode(st.mode)} uid {st.uid} gid {st.gid}"


def denial(walk: Walk, user: Account, need: Need, *, must_exist: bool = True) -> str | None:
    """Why ``user`` cannot use ``walk.target`` as ``need`` says, naming the first path it is stopped at and
    the permission missing there; None when it can (or, ``must_exist`` False, when the target is not there
    yet: a folder staging will make)."""
    for chain in (walk.target, walk.resolved):
        if chain is None:
            continue
        paths = prefixes(chain)
        for path in paths[:-1]:
            st = walk.stats.get(path)
            if st is None:
                return f"{walk.target} does not exist ({path} is missing)" if must_exist else None
            if not stat.S_ISDIR(st.mode):
                return f"{path} on the way to {walk.target} is not a directory"
            if not _allowed(st, user, 1):
                return (
                    f"user {user.name} cannot enter {path} ({_show(st)}): it lacks search (x) permission "
                    f"there, so it cannot reach {walk.target}"
                )
        leaf = walk.stats.get(paths[-1])
        if leaf is None:
            return f"{walk.target} does not exist" if must_exist else None
        bits = {"exec": 1, "read": 4, "dir": 5, "rw": 6}[need]
        if need == "dir" and not stat.S_ISDIR(leaf.mode):
            return f"{walk.target} is not a directory"
        if need == "exec" and not stat.S_ISREG(leaf.mode):
            return f"{walk.target} is not a regular file"
        if not _allowed(leaf, user, bits):
            return f"user {user.name} cannot {_WHAT[need]} {paths[-1]} ({_show(leaf)})"
    return None


def fix_for(user: str) -> str:
    """The usual way out of a denial, for the report's and the error's last words."""
    return (
        f"move it where user {user} can reach it (e.g. under /opt or /srv), open the directory named to "
        f"{user} (chmod o+x DIR, or a group of {user}), or set [defaults] user to an account that can"
    )


# -- the host's answer ----------------------------------------------------------------------------------
# One round trip: `id` for the user, then for each target its walk and its resolved path's walk.
PROBE_SCRIPT = r"""
u=$1; shift
id -u -- "$u" >/dev/null 2>&1 || { echo "nouser"; exit 0; }
echo "uid $(id -u -- "$u")"; echo "gids $(id -G -- "$u")"
walk() {
  p=$1
  while :; do
    s=$(stat -L -c '%f %u %g' -- "$p" 2>/dev/null) && echo "stat $s $p"
    [ "$p" = / ] && break; p=$(dirname -- "$p")
  done
}
for t in "$@"; do
  echo "target $t"; walk "$t"
  r=$(readlink -f -- "$t" 2>/dev/null) && [ -n "$r" ] && [ "$r" != "$t" ] && { echo "resolved $r"; walk "$r"; }
done
exit 0
"""


def parse_probe(user: str, text: str) -> tuple[Account | None, dict[str, Walk]]:
    """PROBE_SCRIPT's output: the account (None: no such user) and each target's walk."""
    uid: int | None = None
    gids: frozenset[int] = frozenset()
    walks: dict[str, Walk] = {}
    target: str | None = None
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "nouser":
            return None, {}
        if word == "uid" and rest.strip().isdigit():
            uid = int(rest)
        elif word == "gids":
            gids = frozenset(int(g) for g in rest.split() if g.isdigit())
        elif word == "target":
            target = rest
            walks[target] = Walk(target, {})
        elif word == "resolved" and target is not None:
            walks[target] = Walk(target, walks[target].stats, rest)
        elif word == "stat" and target is not None:
            fields = rest.split(" ", 3)
            if len(fields) == 4:
                try:
                    st = PathStat(fields[3], int(fields[0], 16), int(fields[1]), int(fields[2]))
                except ValueError:
                    continue
                walks[target].stats[posixpath.normpath(st.path)] = st
    return (None if uid is None else Account(user, uid, gids)), walks

"""Writing a directory without deleting what the writer did not make.

A command that writes a directory (an export, a Hugging Face checkpoint,
`keras-attn prepare`) replaces only an earlier output of its own kind: any
other non-empty directory is refused by name with what it holds, and the old
directory is moved aside into a fresh temporary name (never a fixed sibling
that could be someone's) and removed only once the new one is in place.
TensorFlow-free: `prepare` runs where TensorFlow is not installed.
"""

import os
import shutil
import tempfile


class DirectoryKind:
    """What an exporter writes into its directory, to tell an earlier export
    of the same kind (replaced) from any other directory (refused):
    `what` describes it in messages, `reason(path)` says why the existing
    directory `path` is not one (None when it is)."""

    def __init__(self, what, reason, replaceable="one that holds such an export",
                 aside_prefix=".export-old-"):
        self.what = what
        self.reason = reason
        self.replaceable = replaceable  # the advice of the refusal
        self.aside_prefix = aside_prefix  # the old directory's temporary home


def check_replaceable(path, kind, argument="path", flag=None):
    """`ValueError` unless `path` is missing, an empty directory or an
    earlier export of `kind` (a `DirectoryKind`): a command that writes a
    directory never deletes what it did not write. The message names the
    directory, why it is not one, and its first entries; nothing is changed.
    `argument` (and the command line's `flag`) name what was given."""
    path = os.fspath(path)
    label = f"`{argument}`" + (f" ({flag})" if flag else "")
    if os.path.islink(path):
        raise ValueError(f"{label} must be a directory, not a symbolic link: {path} -> "
                         f"{os.readlink(path)}. Received: {argument}={path!r}")
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise ValueError(f"{label} must be a directory; {path} is a file. "
                         f"Received: {argument}={path!r}")
    entries = sorted(os.listdir(path))
    if not entries:
        return
    reason = kind.reason(path)
    if reason is not None:
        shown = ", ".join(repr(entry) for entry in entries[:5])
        more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
        raise ValueError(
            f"{label} {path} is not empty and is not {kind.what} ({reason}): it holds "
            f"{shown}{more}. Nothing was changed; give a new or empty directory, or "
            f"{kind.replaceable}. Received: {argument}={path!r}"
        )


def replace_directory(target, path, kind, argument="path"):
    """Moves the complete directory `target` to `path`. An existing `path`
    must be empty or an earlier export of `kind` (`check_replaceable`,
    checked again here: it may have changed during the export); it is moved
    aside into a new directory of our own beside it (never a fixed name that
    could be someone's) and removed only once `target` is in place (put
    back if that fails)."""
    check_replaceable(path, kind, argument)
    if not os.path.lexists(path):
        os.replace(target, path)
        return
    aside = tempfile.mkdtemp(prefix=kind.aside_prefix, dir=os.path.dirname(os.path.abspath(path)))
    old = os.path.join(aside, "old")
    try:
        os.replace(path, old)
    except BaseException:
        os.rmdir(aside)
        raise
    try:
        os.replace(target, path)
    except BaseException:
        os.replace(old, path)  # if even this fails, `aside` keeps it
        os.rmdir(aside)
        raise
    shutil.rmtree(aside, ignore_errors=True)

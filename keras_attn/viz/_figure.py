"""Shared figure plumbing: lazy matplotlib, atomic PNG writes."""

import os
import tempfile


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save(figure, path, dpi=120):
    """Writes `figure` to `path` (PNG) through a temporary file and a rename,
    so a reader never sees a half-written image. Returns `path`."""
    if path is None:
        return None
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, staging = tempfile.mkstemp(suffix=".png", dir=directory)
    os.close(handle)
    try:
        figure.savefig(staging, dpi=dpi, bbox_inches="tight", format="png")
        # mkstemp makes the file private (0600); give it the usual mode.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o666 & ~umask)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    return path

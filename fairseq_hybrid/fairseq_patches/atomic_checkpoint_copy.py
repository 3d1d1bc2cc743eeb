"""Checkpoint copies that a kill cannot leave half-written.

fairseq writes a checkpoint atomically (to ``NAME.tmp``, then a rename) but
then *copies* it to its other names, ``checkpoint_last.pt`` among them,
with a plain file copy.  A run killed during that copy (SIGKILL, a
preempted node) leaves a truncated ``checkpoint_last.pt``, and restarting
the same command fails to load it: the run is lost.  Installing this makes
fairseq's copies go to a temporary file in the destination folder first and
replace the destination with one rename, so ``checkpoint_last.pt`` is
always a whole checkpoint, old or new.  A temporary file that a killed
copy left behind (a whole checkpoint's size) is removed by the next copy to
the same name.
"""

import glob
import os
import tempfile


class AtomicCopyPathManager:
    """fairseq's ``PathManager`` with an atomic ``copy`` for local files."""

    def __init__(self, path_manager):
        self._path_manager = path_manager

    def __getattr__(self, name):
        return getattr(self._path_manager, name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if "://" in src_path or "://" in dst_path:  # remote storage: leave it to iopath
            return self._path_manager.copy(src_path, dst_path, overwrite=overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        folder = os.path.dirname(os.path.abspath(dst_path))
        prefix = os.path.basename(dst_path) + "."
        for stale in glob.glob(os.path.join(glob.escape(folder), glob.escape(prefix) + "*.tmp")):
            os.remove(stale)  # only rank 0 saves, so no other copy is running
        handle, tmp_path = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
        os.close(handle)
        try:
            if not self._path_manager.copy(src_path, tmp_path, overwrite=True):
                return False
            os.replace(tmp_path, dst_path)
            return True
        finally:
            if os.path.exists(tmp_path):
                os.remove(tmp_path)

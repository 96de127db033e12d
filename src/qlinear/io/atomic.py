"""Writing an output so that it either appears complete or not at all.

The data go to a temporary file in the output's folder (same file system), which is renamed over
the output only when it is complete; any error or interruption removes the temporary file. A run
killed with SIGKILL can leave the temporary file (hidden, ``.NAME.*.partial``), never OUTPUT.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError


def check_output(output: Path, inputs: list[Path], force: bool) -> None:
    """Refuse to overwrite an input (even with --force) or an existing output (without --force)."""
    for source in inputs:
        if output.exists() and source.exists() and os.path.samefile(output, source):
            raise UserError(f"{output}: is the input file; qlinear never overwrites its input")
        if output.resolve() == source.resolve():
            raise UserError(f"{output}: is the input file; qlinear never overwrites its input")
    if output.is_dir():
        raise UserError(f"{output}: is a folder; give a file name")
    if output.exists() and not force:
        raise UserError(f"{output}: already exists; pass --force to overwrite it")
    if not output.parent.is_dir():
        raise UserError(f"{output}: the folder {output.parent} does not exist")


@contextmanager
def atomic_output(output: Path):
    """Yields a binary file object; on success the file becomes ``output``."""
    try:
        fd, temporary = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial")
    except OSError as error:
        raise UserError(f"{output}: cannot write in {output.parent} ({error.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, output)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""Writing an output (a file, or a folder for zarr stores) so that it either appears complete or not at all.

The data go to a temporary file in the output's folder (same file system), which is renamed over
the output only when it is complete; any error or interruption removes the temporary file. A run
killed with SIGKILL can leave the temporary file (hidden, ``.NAME.*.partial``), never OUTPUT.
"""

from __future__ import annotations

import os
import shutil
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


def check_output_store(output: Path, source: Path, force: bool) -> None:
    if output.suffix.lower() != ".zarr":
        raise UserError(f"{output}: the output of a .zarr input is a .zarr store")
    if output.exists() and source.exists() and os.path.samefile(output, source):
        raise UserError(f"{output}: is the input store; qlinear never overwrites its input")
    if output.exists() and not force:
        raise UserError(f"{output}: already exists; pass --force to overwrite it")
    if output.exists() and not output.is_dir():
        raise UserError(f"{output}: exists and is not a folder")
    if not output.parent.is_dir():
        raise UserError(f"{output}: the folder {output.parent} does not exist")


@contextmanager
def atomic_store(output: Path):
    """Yields the path of a temporary folder beside ``output``; on success it becomes ``output``
    (an existing ``output`` is moved aside first and removed after the rename)."""
    try:
        temporary = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial"))
    except OSError as error:
        raise UserError(f"{output}: cannot write in {output.parent} ({error.strerror})") from None
    try:
        yield temporary
        os.chmod(temporary, 0o777 & ~_umask())
        old = None
        if output.exists():
            old = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".old"))
            os.rmdir(old)
            os.replace(output, old)
        os.replace(temporary, output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


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


@contextmanager
def atomic_files(outputs: list[Path]):
    """Yields ``(files, temporaries)`` for outputs that belong together (a model and its external data,
    all in one folder): binary file objects and their paths, in a hidden temporary folder beside the
    outputs under the outputs' own names, so that the files refer to each other there as they will in
    place. On success each becomes its output (in the order given: a model after its data)."""
    folder = outputs[0].parent
    try:
        temporary = Path(tempfile.mkdtemp(dir=folder, prefix=f".{outputs[-1].name}.", suffix=".partial"))
    except OSError as error:
        raise UserError(f"{outputs[-1]}: cannot write in {folder} ({error.strerror})") from None
    opened = []
    try:
        paths = [temporary / output.name for output in outputs]
        for path in paths:
            opened.append(open(path, "wb"))
        yield opened, paths
        for f in opened:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        for path, output in zip(paths, outputs):
            os.chmod(path, 0o666 & ~_umask())
            os.replace(path, output)
        os.rmdir(temporary)
    except BaseException:
        for f in opened:
            f.close()
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

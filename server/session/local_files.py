"""A peer's own files on the host's disk, as ``--local-data`` names them (``peertrain simulate``, ``peertrain peers``).

One folder per peer: the folders given, or one folder holding a sub-folder per peer. A file's name is its path
relative to its peer's folder (hidden files and folders left out), as a page names what its person chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runtime.tasks import TaskError


def peer_folders(paths: Sequence[Path]) -> list[Path]:
    """One folder per peer: the folders given, or, when one folder is given and it holds sub-folders and no files,
    each of its sub-folders (in name order). A path that is no folder is an error naming it."""
    paths = [Path(p) for p in paths]
    for path in paths:
        if not path.is_dir():
            raise TaskError(f"--local-data {path}: not a folder (give one folder per peer, or one folder holding a "
                            "sub-folder per peer)")
    if len(paths) == 1:
        entries = [p for p in paths[0].iterdir() if not p.name.startswith(".")]
        if entries and all(p.is_dir() for p in entries):
            return sorted(entries)
    return paths


def folder_files(folder: Path) -> list[tuple[str, bytes]]:
    """Every file under ``folder`` (hidden ones left out) as (its path relative to the folder, its bytes)."""
    files = [p for p in sorted(Path(folder).rglob("*")) if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    return [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in files]

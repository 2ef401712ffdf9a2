"""What made a file, as the outputs that record it name it: the git commit checked out (torch-free)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_head(folder: str | Path = ".") -> str | None:
    """HEAD of the git tree ``folder`` lies in; None outside one (or without git)."""
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_dirty(folder: str | Path = ".") -> bool:
    """Whether tracked files of the git tree ``folder`` lies in differ from HEAD."""
    done = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0 and bool(done.stdout.strip())

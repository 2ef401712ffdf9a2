"""The compatibility suite's fixtures; the fakes themselves and their constants are in compat_fakes.py."""

from compat_fakes import ar_run, compat_root, copy_of, drafter_dir, prompt_files, target_dir

__all__ = ["ar_run", "compat_root", "copy_of", "drafter_dir", "prompt_files", "target_dir"]

"""A Triton cache that can be copied: Triton's file cache with groups found in their own folder.

Triton keeps a compiled kernel as a group of files (its IR stages, the cubin, the metadata) and
records the group by the files' absolute paths. The judge's processes each hold a copy of the
compile run's cache in a folder of their own (the only one they may read of the judge's), where
those paths name nothing: Triton would see a miss and compile, which the sealed worker cannot.
This manager (``TRITON_CACHE_MANAGER``, set by ``ptxgym.languages.triton.runtime.environment``)
looks each file of a group up by its name in the group's own folder, wherever the cache now is.
Triton imports it in the candidate's processes only.
"""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager


class RelocatableCache(FileCacheManager):  # type: ignore[misc]  # triton is untyped
    """``FileCacheManager`` whose groups resolve relative to the cache folder."""

    def get_group(self, filename: str) -> dict[str, str] | None:
        recorded = self.get_file(f"__grp__{filename}")
        if recorded is None:
            return None
        with open(recorded, encoding="utf-8") as handle:
            data = json.load(handle)
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict):
            return None  # not a group Triton wrote: a miss, as Triton's own manager says
        found = {}
        for child, path in children.items():
            local = os.path.join(self.cache_dir, os.path.basename(str(path)))
            if os.path.isfile(local):
                found[str(child)] = local
        return found

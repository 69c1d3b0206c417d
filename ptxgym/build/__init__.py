"""What every action language's build shares: ``result`` (the build record), ``sandbox`` (the
compiler's confinement: what it may read and write), ``budget`` (machine-wide build slots within
the memory budget) and ``sass`` (the static inventory of a built library's SASS)."""

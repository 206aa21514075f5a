"""python -m runtimeproxy == runtime-proxy."""

from .entry import main

main()

"""python -m runtimeproxy == runtime-proxy."""

from .cli import main

main()

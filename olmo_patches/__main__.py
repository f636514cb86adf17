"""``python -m olmo_patches COMMAND [ARGS...]`` (olmo_patches/commands.py lists the commands)."""

from .commands import main

main()

"""`python -m bertlab ...` (and `torchrun -m bertlab pretrain ...`): see bertlab/cli.py."""

from bertlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

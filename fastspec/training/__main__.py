"""``python -m fastspec.training ARGS`` = ``fastspec train-head ARGS`` (what ``torchrun -m fastspec.training`` runs)."""

from fastspec.training.cli import main

if __name__ == "__main__":
    main()

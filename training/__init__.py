"""Scripts that train the weights shipped in ``fastspec/pair/``: not part of the installed library.

Run them from the checkout root as modules (they import ``fastspec`` and each other as the package ``training``):

    python -m training.train_pair      # the target/draft pair (fastspec/pair/target, fastspec/pair/draft)
    python -m training.compare_heads   # pick a head: greedy acceptance of head directories on held-out prompts
    python -m training.head_overlap    # teacher-forced agreement and sampled overlap with the target, two kinds of text

The shipped draft head (fastspec/pair/head, EAGLE-3) is trained by the library's own `fastspec train-head` (its
training.json holds the commands); the last two scripts compare heads. Checkpoints and generated data go to
training/out/ (ignored by git); logs and results of the runs behind the shipped weights are in bench/results/
(index: bench/results/README.md); docs/training.md tells the story.
"""

"""Scripts that train the weights shipped in ``fastspec/pair/``: not part of the installed library.

Run them from the checkout root as modules (they import ``fastspec`` and each other as the package ``training``):

    python -m training.train_pair      # the target/draft pair (fastspec/pair/target, fastspec/pair/draft)
    python -m training.train_head      # the EAGLE-style draft head (fastspec/pair/head)
    python -m training.compare_heads   # pick a head: greedy acceptance of head directories on held-out prompts
    python -m training.head_overlap    # teacher-forced agreement and sampled overlap with the target, two kinds of text

training/heads/eagle3_12k/ is the candidate to replace the shipped head (an EAGLE-3 head from `fastspec train-head`,
fp32, measured in bench/results/eagle3_regression_12k.md; bf16 storage lowers its acceptance from 0.820 to 0.814):
moved to fastspec/pair/head once it is shipped. Checkpoints and generated data go to training/out/ (ignored by
git); logs and results of the runs behind the shipped weights are in bench/results/ (index:
bench/results/README.md); docs/training.md tells the story.
"""

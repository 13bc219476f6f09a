"""Training: the Learner, metrics, renderers (dashboard, plain), checkpoints and logging."""

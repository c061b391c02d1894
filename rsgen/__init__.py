"""rsgen: rejection-sampled training data for vision-language models."""

__version__ = "0.1.0"

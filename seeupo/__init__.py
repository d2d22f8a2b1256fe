"""seeupo: SeeUPO and its baselines, checked exactly on tabular problems and run on language models."""

__version__ = "0.1.0"

"""The decision core of spec-advisor: store, segmentation, performance model and verdicts."""

__version__ = "0.1.0"

"""Calibration: replay sampled traffic on real vLLM servers and fit the advisor's models."""

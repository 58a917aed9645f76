"""Evaluation: the sets, ODmAP@k and R@K, caption mentions and the Figure-3 report."""

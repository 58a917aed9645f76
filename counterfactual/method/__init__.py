"""The method of seed 002: which classes can go (the alpha rules on box tables, co-occurrence),
where they are (masks, detectors), and whether an edit did it (verification)."""

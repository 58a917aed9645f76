"""The sections of ``make bench``, one module each, in the order ``bench.py`` runs them.

Each module declares one :class:`~common.Section` as ``SECTION``: its name (what ``--only``
takes), its options with their defaults, its note, its targets and its ``run(work, args)``,
beside the code it measures. Importing this package pins BLAS and OpenMP to one thread first
(:mod:`common`).
"""

import common  # noqa: F401  (the thread pins, before numpy and torch load)

"""`python -m analysis` is `qrl-analyze`."""

from .cli import main

raise SystemExit(main())

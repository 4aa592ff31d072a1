"""`python -m blockdraft.cli`."""

from . import main

raise SystemExit(main())

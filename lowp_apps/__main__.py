"""`python -m lowp_apps` (and `python -m lowp`): the `lowp` command line."""

from lowp_apps.cli import main

raise SystemExit(main())

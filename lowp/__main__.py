"""`python -m lowp`: the lowp command line."""

from lowp._cli import main

raise SystemExit(main())

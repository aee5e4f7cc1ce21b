"""`python -m solo ...`: the `solo` command."""

from solo.cli import main

raise SystemExit(main())

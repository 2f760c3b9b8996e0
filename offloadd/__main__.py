"""``python -m offloadd``: the command line (:mod:`offloadd.shell.cli`)."""

from offloadd.shell.cli import main

raise SystemExit(main())
